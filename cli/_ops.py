"""Operator commands over the REST API: purge, status, history, procedures, regions.

They talk to a running metasrv through `metasrv.client.MetasrvClient`, never to the kv
backend or Kafka directly, so what an operator sees is exactly what the API serves.

Where the server and token come from, first match wins:
`--url` / `METASRV_URL` / `http.addr` of `--config` / `127.0.0.1:4000`, and
`--token` / `METASRV_TOKEN` / the config's first operator token (viewer token for reads).

Exit codes (scripts rely on them):
0 ok; 1 a purge failed or was cancelled; 2 usage or invalid argument; 3 metasrv unreachable,
not authenticated or not authorized; 4 not found; 5 conflict; 6 `--wait` timed out;
7 any other server error.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console, RenderableType
from rich.table import Table

from cli._options import shared_options
from cli._tables import (
    events_table,
    fmt,
    history_table,
    plan_table,
    procedure_table,
    result,
)
from metasrv import errors, wire
from metasrv.settings import load_settings
from metasrv.wire import MetasrvClient, base_url_from_addr


class Exit(IntEnum):
    """Process exit codes of the operator commands."""

    OK = 0
    PURGE_FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    NOT_FOUND = 4
    CONFLICT = 5
    TIMEOUT = 6
    SERVER_ERROR = 7


# Checked in order: the first matching base class decides the exit code.
_EXIT_BY_ERROR: tuple[tuple[type[BaseException], Exit], ...] = (
    (errors.InvalidArgument, Exit.USAGE),
    (errors.ConfigError, Exit.USAGE),
    (errors.Unavailable, Exit.UNREACHABLE),
    (errors.Unauthenticated, Exit.UNREACHABLE),
    (errors.PermissionDenied, Exit.UNREACHABLE),
    (errors.NotLeader, Exit.UNREACHABLE),
    (errors.NotFound, Exit.NOT_FOUND),
    (errors.Conflict, Exit.CONFLICT),
    (TimeoutError, Exit.TIMEOUT),
    (errors.MetasrvError, Exit.SERVER_ERROR),
)

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="METASRV_URL", help="metasrv base URL or host:port."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="METASRV_TOKEN", help="Bearer token.", show_default=False),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="metasrv TOML config (for http.addr and tokens)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
_CONNECTION = (("url", UrlOpt), ("token", TokenOpt), ("config", ConfigOpt))


def connected(*, write: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command `--url`, `--token` and `--config` and call it with a
    `client: MetasrvClient` for them instead; `write` picks an operator token from the
    config rather than a viewer's."""
    return shared_options(
        _CONNECTION,
        into="client",
        build=lambda url, token, config: _client(url, token, config, write=write),
    )


# --- plumbing ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """Where to send requests and with which token."""

    url: str
    """Base URL of the metasrv."""
    token: str | None
    """Bearer token, if any."""


def resolve_target(
    url: str | None, token: str | None, config: Path | None, *, write: bool
) -> Target:
    """Apply the precedence rules of the module docstring."""
    if url is not None and token is not None:
        return Target(base_url_from_addr(url), token)
    settings = load_settings(config)
    if token is None:
        auth = settings.auth
        candidates = auth.operator_tokens if write else [*auth.viewer_tokens, *auth.operator_tokens]
        token = candidates[0] if candidates else None
    return Target(base_url_from_addr(url or settings.http.addr), token)


@contextmanager
def _client(
    url: str | None, token: str | None, config: Path | None, *, write: bool
) -> Iterator[MetasrvClient]:
    """A client for the resolved target; errors become exit codes with a one-line message."""
    try:
        target = resolve_target(url, token, config, write=write)
        with MetasrvClient(target.url, token=target.token) as client:
            yield client
    except (errors.MetasrvError, TimeoutError) as exc:
        code = next(c for cls, c in _EXIT_BY_ERROR if isinstance(exc, cls))
        name = getattr(exc, "code", "timeout")
        _err.print(f"[bold red]error[/] ({name}): {exc}", markup=True)
        raise typer.Exit(int(code)) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(value), indent=2) + "\n")


def _emit(as_json: bool, data: Any, *human: RenderableType) -> None:
    """`data` as JSON for scripts, or the human renderings (empty strings skipped)."""
    if as_json:
        _print_json(data)
        return
    for item in human:
        if item != "":
            _out.print(item)


# --- commands ---------------------------------------------------------------------------------


@connected(write=True)
def purge(
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", "-t", help="Topic to purge (repeatable); all topics if omitted."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan; submit nothing.")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the procedures until they finish.")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds --wait waits at most.")
    ] = 300.0,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Purge the WAL of some or all topics (exit 1 if a purge fails)."""
    topics = list(topic) if topic else None
    if dry_run:
        plans = client.purge_dry_run(topics)
        _emit(as_json, plans, plan_table(plans, "Purge plan (dry run: nothing submitted)"))
        return
    ids = client.purge(topics)
    if not wait:
        lines = [f"submitted {pid}" for pid in ids] or ["nothing submitted"]
        _emit(as_json, {"procedure_ids": ids}, *lines)
        return
    views = _follow(client, ids, timeout, quiet=as_json)
    _emit(
        as_json,
        views,
        procedure_table(views, "Purge procedures") if views else "nothing submitted",
    )
    if any(v.failed for v in views):
        raise typer.Exit(int(Exit.PURGE_FAILED))


def _follow(
    client: MetasrvClient, ids: Sequence[str], timeout: float, *, quiet: bool
) -> list[wire.Procedure]:
    """Poll the procedures, printing each state or step change on stderr, until terminal."""
    deadline = time.monotonic() + timeout
    seen: dict[str, tuple[str, str | None]] = {}
    while True:
        views = [client.procedure(pid) for pid in ids]
        for v in views:
            now = (v.state, v.step)
            if seen.get(v.id) != now and not quiet:
                detail = f" ({result(v)})" if v.terminal or v.error else ""
                _err.print(f"{v.id} {v.topic or ''}: {v.state} step={v.step or '-'}{detail}")
            seen[v.id] = now
        if all(v.terminal for v in views):
            return views
        if time.monotonic() >= deadline:
            pending = ", ".join(f"{v.id}={v.state}" for v in views if not v.terminal)
            raise TimeoutError(f"procedures not finished after {timeout}s: {pending}")
        time.sleep(0.3)


@connected(write=False)
def status(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Topics (prune point, pruned id, offsets, RF/min ISR, blockers), procedures and
    data-loss alerts."""
    leader = client.leader()
    # Topic views: the plan plus Kafka's replication factor and min ISR of each topic.
    plans = client.topics() if topic is None else [client.topic(topic)]
    active = [
        p for state in ("pending", "running", "retrying") for p in client.procedures(state=state)
    ]
    failed = sorted(
        client.procedures(state="failed"),
        key=lambda p: p.finished_at or datetime.min.replace(tzinfo=UTC),
        reverse=True,
    )[:10]
    events = client.events(topic=topic, kind="wal_data_loss", limit=20)
    _emit(
        as_json,
        {
            "leader": leader,
            "topics": plans,
            "active_procedures": active,
            "failed_procedures": failed,
            "data_loss_events": events,
        },
        f"leader: {leader.leader or '-'}  (asked {client.base_url})",
        plan_table(plans, "Topics"),
        procedure_table(active, "Active procedures") if active else "no active procedures",
        procedure_table(failed, "Recently failed procedures") if failed else "",
        events_table(events, "WAL data-loss events") if events else "",
    )


@connected(write=False)
def history(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 20,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Completed purges, newest first."""
    records = client.history(topic=topic, limit=limit)
    _emit(as_json, records, history_table(records, "Purge history") if records else "no purges")


procedures_app = typer.Typer(help="Inspect and cancel procedures.", no_args_is_help=True)


@procedures_app.command("list")
@connected(write=False)
def procedures_list(
    state: Annotated[str | None, typer.Option("--state", help="Only this state.")] = None,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Known procedures (running ones and recently finished ones)."""
    procs = client.procedures(state=state)
    _emit(as_json, procs, procedure_table(procs, "Procedures"))


@procedures_app.command("show")
@connected(write=False)
def procedures_show(
    procedure_id: Annotated[str, typer.Argument(help="Procedure id.")],
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """One procedure with its per-step timings."""
    proc = client.procedure(procedure_id)
    steps = Table(title="Step timings", title_justify="left")
    steps.add_column("step")
    steps.add_column("seconds", justify="right")
    for name, seconds in proc.timings.items():
        steps.add_row(name, f"{seconds:.3f}")
    outcome = f"outcome: {proc.outcome}" if proc.outcome else ""
    _emit(as_json, proc, procedure_table([proc], f"Procedure {proc.id}"), outcome, steps)


@procedures_app.command("cancel")
@connected(write=True)
def procedures_cancel(
    procedure_id: Annotated[str, typer.Argument(help="Procedure id.")],
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Ask a procedure to stop at its next step boundary."""
    proc = client.cancel(procedure_id)
    _emit(as_json, proc, f"{proc.id}: {proc.state}")


regions_app = typer.Typer(help="List, register and drop regions.", no_args_is_help=True)


@regions_app.command("list")
@connected(write=False)
def regions_list(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Registered regions with their topic and node."""
    regions = client.regions(topic=topic)
    table = Table(title="Regions", title_justify="left")
    for col in ("region_id", "table", "number", "topic", "node"):
        table.add_column(col)
    for r in regions:
        table.add_row(
            str(r.region_id),
            str(r.region_id >> 32),
            str(r.region_id & 0xFFFFFFFF),
            r.topic,
            fmt(r.node_id),
        )
    _emit(as_json, regions, table)


@regions_app.command("add")
@connected(write=True)
def regions_add(
    region_id: Annotated[int, typer.Argument(min=0, help="64-bit region id.")],
    node: Annotated[int, typer.Option("--node", min=0, help="Datanode id hosting it.")],
    topic: Annotated[
        str | None, typer.Option("--topic", "-t", help="Topic; metasrv picks one if omitted.")
    ] = None,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Register a region."""
    region = client.add_region(region_id, node, topic)
    _emit(as_json, region, f"region {region.region_id} registered on topic {region.topic}")


@regions_app.command("drop")
@connected(write=True)
def regions_drop(
    region_id: Annotated[int, typer.Argument(min=0, help="64-bit region id.")],
    *,
    client: MetasrvClient,
) -> None:
    """Deregister a region (it no longer pins its topic)."""
    client.drop_region(region_id)
    _out.print(f"region {region_id} dropped")


_COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("purge", purge),
    ("status", status),
    ("history", history),
)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    for name, func in _COMMANDS:
        app.command(name)(func)
    app.add_typer(procedures_app, name="procedures")
    app.add_typer(regions_app, name="regions")
