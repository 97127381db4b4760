"""The one `metasrv` command (DESIGN §7). Each area registers its sub-commands."""

from __future__ import annotations

import typer

from cli import _daemon, _db, _demo, _ops, _reconcile, _stack
from cli._ops import Exit, resolve_target
from cli._tables import why_not_purged

app = typer.Typer(
    name="metasrv",
    help="Control plane that purges a database's Kafka remote WAL.",
    no_args_is_help=True,
    add_completion=False,
)

for _module in (_daemon, _stack, _demo, _ops, _reconcile, _db):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["Exit", "app", "main", "resolve_target", "why_not_purged"]
