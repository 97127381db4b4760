"""Operator commands over the REST API: purge, status, plan, history, events, leader, and the
`topics` (with `resolve-reset`), `procedures` and `regions` groups (connection and exit
codes: `cli/_connect.py`).

Every read command prints a table in a terminal, TSV in a pipe (`cli/_sheet.py`), and with
`--json` the server's JSON body unchanged (a list answer as its array).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from urllib.parse import quote

import typer

from cli._connect import Exit, JsonOpt, connected, err, read, read_json
from cli._reset import resolve_reset
from cli._sheet import Output
from cli._tables import (
    events_sheet,
    history_sheet,
    leader_sheet,
    plan_sheet,
    procedure_sheet,
    region_sheet,
    result,
    steps_sheet,
)
from metasrv import wire
from metasrv.settings import parse_duration
from metasrv.wire import MetasrvClient


def _topic_path(topic: str) -> str:
    return f"/v1/topics/{quote(topic, safe='')}"


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
    out = Output()
    request = wire.PurgeRequest(topics=list(topic) if topic else None, dry_run=dry_run)
    if dry_run:
        plans, body = read(client, wire.PlanList, "POST", "/v1/purge", payload=request)
        if as_json:
            out.json(body["topics"])
        else:
            out.show(plan_sheet(plans.topics, "Purge plan (dry run: nothing submitted)"))
        return
    submitted, body = read(client, wire.PurgeSubmitted, "POST", "/v1/purge", payload=request)
    ids = submitted.procedure_ids
    if not wait:
        if as_json:
            out.json(body)
        for pid in ids:
            if not as_json:
                out.line(f"submitted {pid}")
        if not ids and not as_json:
            out.line("nothing submitted")
        return
    views, bodies = _follow(client, ids, timeout, quiet=as_json)
    if as_json:
        out.json(bodies)
    else:
        out.show(procedure_sheet(views, "Purge procedures", empty="nothing submitted"))
    if any(v.failed for v in views):
        raise typer.Exit(int(Exit.PURGE_FAILED))


def _follow(
    client: MetasrvClient, ids: Sequence[str], timeout: float, *, quiet: bool
) -> tuple[list[wire.Procedure], list[Any]]:
    """Poll the procedures, printing each state or step change on stderr, until terminal."""
    deadline = time.monotonic() + timeout
    seen: dict[str, tuple[str, str | None]] = {}
    while True:
        answers = [read_json(client, wire.Procedure, f"/v1/procedures/{pid}") for pid in ids]
        views = [view for view, _ in answers]
        for v in views:
            now = (v.state, v.step)
            if seen.get(v.id) != now and not quiet:
                detail = f" ({result(v)})" if v.terminal or v.error else ""
                line = f"{v.id} {v.topic or ''}: {v.state} step={v.step or '-'}{detail}"
                err.print(line, markup=False)
            seen[v.id] = now
        if all(v.terminal for v in views):
            return views, [body for _, body in answers]
        if time.monotonic() >= deadline:
            pending = ", ".join(f"{v.id}={v.state}" for v in views if not v.terminal)
            raise TimeoutError(f"procedures not finished after {timeout}s: {pending}")
        time.sleep(0.3)


def _finished_at(pair: tuple[wire.Procedure, Any]) -> datetime:
    return pair[0].finished_at or datetime.min.replace(tzinfo=UTC)


@connected(write=False)
def status(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Topics (offsets, prune point, RF/min ISR, why not purged), procedures, data-loss events."""
    out = Output()
    leader, leader_body = read_json(client, wire.Leader, "/v1/leader")
    # Topic views: the plan plus Kafka's replication factor and min ISR of each topic.
    if topic is None:
        listed, body = read_json(client, wire.TopicList, "/v1/topics")
        plans, plan_bodies = listed.topics, body["topics"]
    else:
        one, one_body = read_json(client, wire.Topic, _topic_path(topic))
        plans, plan_bodies = [one], [one_body]
    if not out.terminal and not as_json:
        out.show(plan_sheet(plans, "Topics"))
        return
    active: list[tuple[wire.Procedure, Any]] = []
    for state in ("pending", "running", "retrying"):
        listed_procs, procs_body = read_json(
            client, wire.ProcedureList, "/v1/procedures", state=state
        )
        active += zip(listed_procs.procedures, procs_body["procedures"], strict=True)
    failed_list, failed_body = read_json(
        client, wire.ProcedureList, "/v1/procedures", state="failed"
    )
    failed = sorted(
        zip(failed_list.procedures, failed_body["procedures"], strict=True),
        key=_finished_at,
        reverse=True,
    )[:10]
    events, events_body = read_json(
        client, wire.WalEventList, "/v1/events", topic=topic, kind="wal_data_loss", limit=20
    )
    if as_json:
        out.json(
            {
                "leader": leader_body,
                "topics": plan_bodies,
                "active_procedures": [body for _, body in active],
                "failed_procedures": [body for _, body in failed],
                "data_loss_events": events_body["events"],
            }
        )
        return
    out.show(
        plan_sheet(plans, "Topics"),
        procedure_sheet([p for p, _ in active], "Active procedures", empty="no active procedures"),
        procedure_sheet([p for p, _ in failed], "Recently failed procedures"),
        events_sheet(events.events, "WAL data-loss events") if events.events else "",
        lead=f"leader: {leader.leader or '-'}  (asked {client.base_url})",
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
    records, body = read_json(
        client, wire.PurgeHistory, "/v1/purge/history", topic=topic, limit=limit
    )
    Output().emit(as_json, body["purges"], history_sheet(records.purges, "Purge history"))


def since_time(value: str | None) -> str | None:
    """`--since`: an RFC 3339 time, or a duration ("90m", "1h30m", "7d") meaning that long
    ago; the RFC 3339 UTC time the API takes."""
    if value is None:
        return None
    try:
        at = wire.parse_rfc3339(value)
    except ValueError as not_a_time:
        try:
            ago = parse_duration(value)
        except ValueError:
            raise typer.BadParameter(
                f"{not_a_time}, or a duration such as 90m, 1h30m, 7d"
            ) from None
        at = datetime.now(tz=UTC) - timedelta(seconds=ago)
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


_KINDS = ", ".join(k.value for k in wire.EventKind)


@connected(write=False)
def events(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    kind: Annotated[
        list[wire.EventKind] | None,
        typer.Option("--kind", "-k", help=f"Only this kind (repeatable): {_KINDS}."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            "-s",
            callback=since_time,
            help=f"Only events since this RFC 3339 time ({wire.RFC3339_EXAMPLE}) "
            "or this long ago (90m, 7d).",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Prune attempts (started, deleted, skipped and why, retrying, failed, cancelled) and
    WAL data loss, newest first."""
    kinds = [k.value for k in kind] if kind else None
    found, body = read_json(
        client, wire.WalEventList, "/v1/events", topic=topic, kind=kinds, since=since, limit=limit
    )
    Output().emit(as_json, body["events"], events_sheet(found.events, "WAL events"))


@connected(write=False)
def plan(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Where each topic may be purged now, and what blocks it."""
    plans, body = read_json(client, wire.PlanList, "/v1/purge/plan", topic=topic)
    Output().emit(as_json, body["topics"], plan_sheet(plans.topics, "Purge plan"))


@connected(write=False)
def leader(
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Which process leads, as the asked one knows it."""
    view, body = read_json(client, wire.Leader, "/v1/leader")
    Output().emit(as_json, body, leader_sheet(view))


topics_app = typer.Typer(help="WAL topics: offsets, prune point, durability.", no_args_is_help=True)


@topics_app.command("list")
@connected(write=False)
def topics_list(
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Every WAL topic with its regions, offsets, prune point and RF/min ISR."""
    listed, body = read_json(client, wire.TopicList, "/v1/topics")
    Output().emit(as_json, body["topics"], plan_sheet(listed.topics, "Topics"))


@topics_app.command("show")
@connected(write=False)
def topics_show(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """One topic (its offsets read afresh from Kafka)."""
    view, body = read_json(client, wire.Topic, _topic_path(topic))
    Output().emit(as_json, body, plan_sheet([view], f"Topic {topic}"))


procedures_app = typer.Typer(help="Inspect and cancel procedures.", no_args_is_help=True)


@procedures_app.command("list")
@connected(write=False)
def procedures_list(
    state: Annotated[str | None, typer.Option("--state", help="Only this state.")] = None,
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 100,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Known procedures (unfinished ones and recently finished ones), newest first."""
    procs, body = read_json(
        client, wire.ProcedureList, "/v1/procedures", state=state, topic=topic, limit=limit
    )
    sheet = procedure_sheet(procs.procedures, "Procedures", empty="no procedures")
    Output().emit(as_json, body["procedures"], sheet)


@procedures_app.command("show")
@connected(write=False)
def procedures_show(
    procedure_id: Annotated[str, typer.Argument(help="Procedure id.")],
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """One procedure with its per-step timings."""
    proc, body = read_json(client, wire.Procedure, f"/v1/procedures/{quote(procedure_id, safe='')}")
    Output().emit(
        as_json,
        body,
        procedure_sheet([proc], f"Procedure {proc.id}"),
        f"outcome: {proc.outcome}" if proc.outcome else "",
        steps_sheet(proc),
    )


@procedures_app.command("cancel")
@connected(write=True)
def procedures_cancel(
    procedure_id: Annotated[str, typer.Argument(help="Procedure id.")],
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Ask a procedure to stop at its next step boundary."""
    path = f"/v1/procedures/{quote(procedure_id, safe='')}/cancel"
    proc, body = read(client, wire.Procedure, "POST", path)
    out = Output()
    if as_json:
        out.json(body)
    else:
        out.line(f"{proc.id}: {proc.state}")


regions_app = typer.Typer(help="List, show, register and drop regions.", no_args_is_help=True)


@regions_app.command("list")
@connected(write=False)
def regions_list(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=100_000)] = 10_000,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Registered regions with their topic, node, flushed id and replay start."""
    regions, body = read_json(client, wire.RegionList, "/v1/regions", topic=topic, limit=limit)
    Output().emit(as_json, body["regions"], region_sheet(regions.regions, "Regions"))


@regions_app.command("show")
@connected(write=False)
def regions_show(
    region_id: Annotated[int, typer.Argument(min=0, help="64-bit region id.")],
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """One region: route, latest stat, prunable id and replay start."""
    region, body = read_json(client, wire.Region, f"/v1/regions/{region_id}")
    Output().emit(as_json, body, region_sheet([region], f"Region {region_id}"))


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
    request = wire.RegisterRegion(region_id=region_id, node_id=node, topic=topic)
    region, body = read(client, wire.RegisteredRegion, "POST", "/v1/regions", payload=request)
    out = Output()
    if as_json:
        out.json(body)
    else:
        out.line(f"region {region.region_id} registered on topic {region.topic}")


@regions_app.command("drop")
@connected(write=True)
def regions_drop(
    region_id: Annotated[int, typer.Argument(min=0, help="64-bit region id.")],
    *,
    client: MetasrvClient,
) -> None:
    """Deregister a region (it no longer pins its topic)."""
    client.drop_region(region_id)
    Output().line(f"region {region_id} dropped")


_COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("purge", purge),
    ("status", status),
    ("plan", plan),
    ("history", history),
    ("events", events),
    ("leader", leader),
)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    for name, func in _COMMANDS:
        app.command(name)(func)
    topics_app.command("resolve-reset")(resolve_reset)
    app.add_typer(topics_app, name="topics")
    # `metasrv topic resolve-reset` as operators' runbooks may spell it.
    app.add_typer(topics_app, name="topic", hidden=True)
    app.add_typer(procedures_app, name="procedures")
    app.add_typer(regions_app, name="regions")
