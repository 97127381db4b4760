"""`metasrv db upgrade|downgrade|current`: Alembic migrations of the SQL stores."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy.engine import make_url

from metasrv.errors import MetasrvError
from metasrv.settings import Settings, load_settings

db_app = typer.Typer(help="SQL schema migrations (Alembic).", no_args_is_help=True)

ConfigOpt = Annotated[
    Path | None, typer.Option("-c", "--config", help="TOML config file (DESIGN §6).")
]
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="Migrate only this database URL instead of the configured ones."),
]


def _urls(config: Path | None, url: str | None) -> list[str]:
    """The databases to migrate: --url, else the history store and the SQL kv store."""
    if url:
        return [url]
    try:
        settings: Settings = load_settings(config)
    except MetasrvError as exc:
        raise typer.BadParameter(exc.message) from exc
    urls = [settings.history.url]
    if settings.kv.backend == "sql" and settings.kv.sql_url not in urls:
        urls.append(settings.kv.sql_url)
    return urls


def _show(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _fail(url: str, exc: Exception) -> typer.Exit:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    typer.echo(f"error: migrating {_show(url)} failed: {first}", err=True)
    return typer.Exit(1)


@db_app.command("upgrade")
def upgrade(
    config: ConfigOpt = None,
    url: UrlOpt = None,
    revision: Annotated[str, typer.Option("--to", help="Target revision.")] = "head",
) -> None:
    """Create or migrate the SQL tables up to the newest schema (idempotent)."""
    import migrations
    from metasrv.sql import engine_url

    for target in _urls(config, url):
        try:
            migrations.upgrade(engine_url(target), revision)
        except Exception as exc:
            raise _fail(target, exc) from exc
        typer.echo(f"{_show(target)}: at {migrations.current_revision(engine_url(target))}")


@db_app.command("downgrade")
def downgrade(
    config: ConfigOpt = None,
    url: UrlOpt = None,
    revision: Annotated[str, typer.Option("--to", help="Target revision.")] = "base",
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Migrate the SQL tables down ("base" drops every metasrv table and its data)."""
    import migrations
    from metasrv.sql import engine_url

    targets = _urls(config, url)
    if not yes:
        typer.confirm(
            f"Downgrade {', '.join(_show(t) for t in targets)} to {revision}? Data may be lost",
            abort=True,
        )
    for target in targets:
        try:
            migrations.downgrade(engine_url(target), revision)
        except Exception as exc:
            raise _fail(target, exc) from exc
        current = migrations.current_revision(engine_url(target))
        typer.echo(f"{_show(target)}: at {current or 'base'}")


@db_app.command("current")
def current(config: ConfigOpt = None, url: UrlOpt = None) -> None:
    """Print the schema revision of each configured database."""
    import migrations
    from metasrv.sql import engine_url

    for target in _urls(config, url):
        try:
            rev = migrations.current_revision(engine_url(target))
        except Exception as exc:
            raise _fail(target, exc) from exc
        typer.echo(f"{_show(target)}: at {rev or 'base'} (head {migrations.head_revision()})")


def register(app: typer.Typer) -> None:
    """Add `metasrv db ...` to the root app."""
    app.add_typer(db_app, name="db")
