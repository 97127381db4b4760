"""The one `metasrv` command (DESIGN §7). Each area registers its sub-commands."""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import typer

from cli import _archive, _daemon, _db, _demo, _ops, _reconcile, _stack
from cli._connect import Exit, resolve_target
from cli._tables import why_not_purged

app = typer.Typer(
    name="metasrv",
    help="Control plane that purges a database's Kafka remote WAL.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"metasrv {version('metasrv')}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the installed package's version and exit.",
        ),
    ] = False,
) -> None:
    """Control plane that purges a database's Kafka remote WAL."""


for _module in (_daemon, _archive, _stack, _demo, _ops, _reconcile, _db):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["Exit", "app", "main", "resolve_target", "why_not_purged"]
