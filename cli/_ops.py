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

import typer
from rich.console import Console, RenderableType
from rich.table import Table

from metasrv import errors
from metasrv.client import (
    FAILED_STATES,
    MetasrvClient,
    ProcedureInfo,
    PurgeRecord,
    WalEvent,
    base_url_from_addr,
)
from metasrv.model import TopicPlan
from metasrv.settings import load_settings


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


def _fmt(value: int | float | None) -> str:
    return "-" if value is None else str(value)


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _elapsed(proc: ProcedureInfo) -> str:
    start = proc.started_at or proc.submitted_at
    if start is None:
        return "-"
    end = proc.finished_at or datetime.now(tz=start.tzinfo)
    return f"{(end - start).total_seconds():.2f}s"


def why_not_purged(plan: TopicPlan) -> str:
    """One line telling an operator what a purge of this topic would do now, or why not."""
    if plan.data_loss:
        regions = ", ".join(str(r) for r in plan.data_loss)
        return f"WAL DATA LOSS: Kafka no longer holds entries needed by region(s) {regions}"
    if plan.blocked_by:
        reasons = ", ".join(f"region {b.region_id} ({b.reason})" for b in plan.blocked_by)
        return f"blocked by {reasons}"
    if plan.prune_point is None:
        return "no regions mapped" if plan.region_count == 0 else "no prune point"
    if plan.reclaimable_entries <= 0:
        return "up to date: nothing below the prune point left to delete"
    return f"purgeable: {plan.reclaimable_entries} entries below {plan.prune_point}"


# --- tables -----------------------------------------------------------------------------------


def _plan_table(plans: Sequence[TopicPlan], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("topic", "regions", "prune point", "pruned id", "log start", "high wm"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    table.add_column("reclaimable", justify="right")
    table.add_column("why / blocked regions")
    for p in plans:
        why = why_not_purged(p)
        style = "bold red" if p.data_loss else ("yellow" if p.blocked_by else "")
        table.add_row(
            p.topic,
            str(p.region_count),
            _fmt(p.prune_point),
            _fmt(p.pruned_entry_id),
            _fmt(p.log_start_offset),
            _fmt(p.high_watermark),
            str(p.reclaimable_entries),
            f"[{style}]{why}[/]" if style else why,
        )
    return table


def _result(proc: ProcedureInfo) -> str:
    """The error (with its code) of a failed or retrying procedure, else its outcome."""
    if proc.state in FAILED_STATES or not proc.terminal:
        if proc.error and proc.error_code:
            return f"{proc.error_code}: {proc.error}"
        return proc.error or ""
    return proc.outcome or ""


def _procedure_table(procs: Sequence[ProcedureInfo], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "kind", "topic", "state", "step", "attempts", "elapsed", "error / outcome"):
        table.add_column(col, overflow="fold")
    for p in procs:
        state = f"[red]{p.state}[/]" if p.state in FAILED_STATES else p.state
        table.add_row(
            p.id,
            p.kind,
            p.topic or "-",
            state,
            p.step or "-",
            str(p.attempts),
            _elapsed(p),
            _result(p),
        )
    return table


def _history_table(records: Sequence[PurgeRecord], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    cols = ("finished", "topic", "prune point", "previous", "deleted", "bytes", "took", "procedure")
    for col in cols:
        table.add_column(col, overflow="fold")
    for r in records:
        table.add_row(
            _when(r.finished_at),
            r.topic,
            str(r.prune_point),
            _fmt(r.previous_pruned_entry_id),
            f"{r.entries_deleted}{' (logical)' if r.logical_delete else ''}",
            str(r.bytes_estimated),
            f"{r.duration_s:.2f}s",
            r.procedure_id,
        )
    return table


def _events_table(events: Sequence[WalEvent], title: str) -> Table:
    table = Table(title=title, title_justify="left", style="red")
    for col in ("at", "topic", "kind", "region", "details"):
        table.add_column(col, overflow="fold")
    for e in events:
        table.add_row(
            _when(e.at),
            e.topic,
            e.kind,
            _fmt(e.region_id),
            json.dumps(e.details, sort_keys=True),
        )
    return table


# --- commands ---------------------------------------------------------------------------------


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
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Purge the WAL of some or all topics (exit 1 if a purge fails)."""
    topics = list(topic) if topic else None
    with _client(url, token, config, write=True) as client:
        if dry_run:
            plans = client.purge_dry_run(topics)
            _emit(as_json, plans, _plan_table(plans, "Purge plan (dry run: nothing submitted)"))
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
        _procedure_table(views, "Purge procedures") if views else "nothing submitted",
    )
    if any(v.state in FAILED_STATES for v in views):
        raise typer.Exit(int(Exit.PURGE_FAILED))


def _follow(
    client: MetasrvClient, ids: Sequence[str], timeout: float, *, quiet: bool
) -> list[ProcedureInfo]:
    """Poll the procedures, printing each state or step change on stderr, until terminal."""
    deadline = time.monotonic() + timeout
    seen: dict[str, tuple[str, str | None]] = {}
    while True:
        views = [client.procedure(pid) for pid in ids]
        for v in views:
            now = (v.state, v.step)
            if seen.get(v.id) != now and not quiet:
                detail = f" ({_result(v)})" if v.terminal or v.error else ""
                _err.print(f"{v.id} {v.topic or ''}: {v.state} step={v.step or '-'}{detail}")
            seen[v.id] = now
        if all(v.terminal for v in views):
            return views
        if time.monotonic() >= deadline:
            pending = ", ".join(f"{v.id}={v.state}" for v in views if not v.terminal)
            raise TimeoutError(f"procedures not finished after {timeout}s: {pending}")
        time.sleep(0.3)


def status(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Topics (prune point, pruned id, offsets, blockers), procedures and data-loss alerts."""
    with _client(url, token, config, write=False) as client:
        leader = client.leader()
        plans = client.plan(topic)
        active = [
            p
            for state in ("pending", "running", "retrying")
            for p in client.procedures(state=state)
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
        f"leader: {leader.get('leader') or '-'}  (asked {client.base_url})",
        _plan_table(plans, "Topics"),
        _procedure_table(active, "Active procedures") if active else "no active procedures",
        _procedure_table(failed, "Recently failed procedures") if failed else "",
        _events_table(events, "WAL data-loss events") if events else "",
    )


def history(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 20,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Completed purges, newest first."""
    with _client(url, token, config, write=False) as client:
        records = client.history(topic=topic, limit=limit)
    _emit(as_json, records, _history_table(records, "Purge history") if records else "no purges")


procedures_app = typer.Typer(help="Inspect and cancel procedures.", no_args_is_help=True)


@procedures_app.command("list")
def procedures_list(
    state: Annotated[str | None, typer.Option("--state", help="Only this state.")] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Known procedures (running ones and recently finished ones)."""
    with _client(url, token, config, write=False) as client:
        procs = client.procedures(state=state)
    _emit(as_json, procs, _procedure_table(procs, "Procedures"))


@procedures_app.command("show")
def procedures_show(
    procedure_id: Annotated[str, typer.Argument(help="Procedure id.")],
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """One procedure with its per-step timings."""
    with _client(url, token, config, write=False) as client:
        proc = client.procedure(procedure_id)
    steps = Table(title="Step timings", title_justify="left")
    steps.add_column("step")
    steps.add_column("seconds", justify="right")
    for name, seconds in proc.timings.items():
        steps.add_row(name, f"{seconds:.3f}")
    outcome = f"outcome: {proc.outcome}" if proc.outcome else ""
    _emit(as_json, proc, _procedure_table([proc], f"Procedure {proc.id}"), outcome, steps)


@procedures_app.command("cancel")
def procedures_cancel(
    procedure_id: Annotated[str, typer.Argument(help="Procedure id.")],
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Ask a procedure to stop at its next step boundary."""
    with _client(url, token, config, write=True) as client:
        proc = client.cancel(procedure_id)
    _emit(as_json, proc, f"{proc.id}: {proc.state}")


regions_app = typer.Typer(help="List, register and drop regions.", no_args_is_help=True)


@regions_app.command("list")
def regions_list(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Registered regions with their topic and node."""
    with _client(url, token, config, write=False) as client:
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
            _fmt(r.node_id),
        )
    _emit(as_json, [r.raw for r in regions], table)


@regions_app.command("add")
def regions_add(
    region_id: Annotated[int, typer.Argument(min=0, help="64-bit region id.")],
    node: Annotated[int, typer.Option("--node", min=0, help="Datanode id hosting it.")],
    topic: Annotated[
        str | None, typer.Option("--topic", "-t", help="Topic; metasrv picks one if omitted.")
    ] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Register a region."""
    with _client(url, token, config, write=True) as client:
        region = client.add_region(region_id, node, topic)
    _emit(as_json, region.raw, f"region {region.region_id} registered on topic {region.topic}")


@regions_app.command("drop")
def regions_drop(
    region_id: Annotated[int, typer.Argument(min=0, help="64-bit region id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Deregister a region (it no longer pins its topic)."""
    with _client(url, token, config, write=True) as client:
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
