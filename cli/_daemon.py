"""`metasrv start -c FILE`: the daemon (one uvicorn worker on `http.addr`, JSON-line logs).

Without `-c` it runs the embedded default: the SQL kv backend and the history store on
SQLite files in the working directory, both migrated at start (no etcd, no setup).
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from metasrv.errors import ConfigError
from metasrv.settings import Settings, load_settings, split_host_port

SWITCH_INTERVAL = 0.0005
"""Seconds a thread holding the GIL runs before a waiting thread gets it (Python: 0.005)."""

# Attributes every LogRecord has; anything else came from `extra=` and is logged as a field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured duplicate of the message
}


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the `extra` fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str) -> None:
    """JSON lines on stderr for every logger (uvicorn's included); Alembic's at WARNING
    unless `level` is debug."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # Alembic logs its set-up ("setup plugin ...", "Context impl ...", "Will assume ... DDL")
    # at INFO each time a migration or the schema check runs: every start and every /readyz.
    # Its warnings and errors still show; --log-level debug shows all of it.
    if root.level > logging.DEBUG:
        logging.getLogger("alembic").setLevel(logging.WARNING)


def split_addr(addr: str) -> tuple[str, int]:
    """`host:port` (also `[v6]:port`, `:port`) -> (host, port); empty host binds all."""
    parsed = split_host_port(addr)
    if parsed is None:
        raise ConfigError(f"http.addr must be host:port, got {addr!r}")
    return parsed[0].strip("[]") or "0.0.0.0", parsed[1]


def serve(settings: Settings) -> None:
    """Run the app in this process until SIGINT/SIGTERM."""
    import uvicorn

    from api import create_app
    from api.auth import check_exposure
    from api.serving import uvicorn_config

    host, port = split_addr(settings.http.addr)
    check_exposure(settings.auth, host)
    # The GC pacer (metasrv/process/_gc_pacer.py) collects the young generation every 50 ms; the
    # interpreter's own trigger is only a backstop, set high so it rarely fires in between.
    gc.set_threshold(50_000, 20, 20)
    # A worker thread doing Python work (the etcd client building a checkpoint batch,
    # the map load decoding routes) keeps the GIL until the interpreter asks it to give
    # way, by default after 5 ms; the event loop gives the GIL up on every socket call,
    # so each of a heartbeat's several calls could wait that long. 0.5 ms bounds it.
    sys.setswitchinterval(SWITCH_INTERVAL)
    config = uvicorn_config(
        create_app(settings),
        settings.http,
        host,
        port,
        loop="uvloop",
        timeout_graceful_shutdown=15,
    )
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        # Startup failed (bad kv URL, port in use...); the reason is already logged.
        raise typer.Exit(code=1)


def prepare_history(settings: Settings, config: Path | None) -> None:
    """The embedded default (no config file) migrates its SQLite history file itself; any
    other history database that lacks the newest schema gets the exact `metasrv db
    upgrade` command logged (and `/readyz` stays not ready until it has run)."""
    from metasrv.errors import Unavailable
    from metasrv.sql import engine_url, is_sqlite, migrate_embedded, schema_problem, upgrade_command

    url = engine_url(settings.history.url)
    log = logging.getLogger(__name__)
    if config is None and is_sqlite(url):
        migrate_embedded(url)
        return
    engine = create_engine(url, poolclass=NullPool)
    try:
        problem = schema_problem(engine)
    except Unavailable as exc:
        log.warning("history database not checked", extra={"error": str(exc)})
        return
    finally:
        engine.dispose()
    if problem is not None:
        log.warning(
            "history database not migrated: run `%s`; /readyz is not ready until then",
            upgrade_command(config),
            extra={"reason": problem, "command": upgrade_command(config)},
        )


def register(app: typer.Typer) -> None:
    """Add `metasrv start`."""

    @app.command("start")
    def start(
        config: Annotated[
            Path | None,
            typer.Option(
                "-c",
                "--config",
                help="TOML configuration (DESIGN §6); METASRV_* environment variables override it.",
            ),
        ] = None,
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    ) -> None:
        """Run the metasrv daemon (one process; leader election through the kv backend)."""
        configure_logging(log_level)
        try:
            settings = load_settings(config)
        except ConfigError as exc:
            typer.echo(f"metasrv: {exc}", err=True)
            raise typer.Exit(code=2) from exc
        logging.getLogger(__name__).info(
            "starting metasrv",
            extra={
                "addr": settings.http.addr,
                "kv_backend": settings.kv.backend,
                "config": str(config) if config else "embedded default",
            },
        )
        try:
            prepare_history(settings, config)
            serve(settings)
        except ConfigError as exc:
            typer.echo(f"metasrv: {exc}", err=True)
            raise typer.Exit(code=2) from exc
