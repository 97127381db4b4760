"""What the operator commands show of the API's answers: one `Sheet` per kind of answer, and
the one-line verdicts (why a topic is not purged, how a procedure ended)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from cli._sheet import Column, Row, Sheet
from metasrv import wire


def fmt(value: int | float | None, missing: str = "-") -> str:
    return missing if value is None else str(value)


def when(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def elapsed(proc: wire.Procedure) -> str | None:
    start = proc.started_at or proc.submitted_at
    if start is None:
        return None
    end = proc.finished_at or datetime.now(tz=start.tzinfo)
    return f"{(end - start).total_seconds():.2f}s"


def why_not_purged(plan: wire.TopicPlan) -> str:
    """One line telling an operator what a purge of this topic would do now, or why not."""
    if plan.topic_reset:
        return f"TOPIC RESET (WAL data loss; resolve-reset once rebuilt): {plan.topic_reset}"
    if plan.data_loss:
        regions = ", ".join(str(r) for r in plan.data_loss)
        return f"WAL DATA LOSS: Kafka no longer holds entries needed by region(s) {regions}"
    if plan.kafka_unavailable:
        return f"Kafka unavailable: {plan.kafka_unavailable}"
    if plan.blocked_by:
        reasons = ", ".join(
            f"consumer group {b.consumer_group} ({b.reason})"
            if b.consumer_group is not None
            else f"the WAL archive ({b.reason})"
            if b.topic is not None
            else f"region {b.region_id} ({b.reason})"
            for b in plan.blocked_by
        )
        return f"blocked by {reasons}"
    if plan.prune_point is None:
        return "no regions mapped" if plan.region_count == 0 else "no prune point"
    holding = [g.consumer_group for g in plan.pinned_groups if g.holds_prune_point]
    held = f" (held by consumer group {', '.join(holding)})" if holding else ""
    if plan.reclaimable_entries <= 0:
        return f"up to date: nothing below the prune point left to delete{held}"
    return f"purgeable: {plan.reclaimable_entries} entries below {plan.prune_point}{held}"


def result(proc: wire.Procedure) -> str:
    """The error (with its code) of a failed or retrying procedure, else its outcome."""
    if proc.failed or not proc.terminal:
        if proc.error and proc.error_code:
            return f"{proc.error_code}: {proc.error}"
        return proc.error or ""
    return proc.outcome or ""


def durability(topic: wire.Topic) -> str:
    """`RF/min ISR` as Kafka reports them, `?` where unknown (e.g. `3/2`)."""
    return f"{fmt(topic.replication_factor, '?')}/{fmt(topic.min_insync_replicas, '?')}"


# --- sheets -----------------------------------------------------------------------------------

_PLAN_COLUMNS = (
    Column("topic", "topic", topic=True),
    Column("regions", "regions", numeric=True),
    Column("prune point", "prune_point", numeric=True),
    Column("pruned id", "pruned_entry_id", numeric=True),
    Column("log start", "log_start_offset", numeric=True),
    Column("high wm", "high_watermark", numeric=True),
    Column("reclaimable", "reclaimable_entries", numeric=True),
)
_DURABILITY = Column("RF/ISR", "rf_min_isr", numeric=True)
_WHY = Column("why", "why")


def plan_sheet(plans: Sequence[wire.TopicPlan], title: str) -> Sheet:
    """The plans; topic views (`wire.Topic`) also get their `RF/ISR` column."""
    with_durability = bool(plans) and all(isinstance(p, wire.Topic) for p in plans)
    rows = []
    for p in plans:
        unavailable = p.blocked_by or p.kafka_unavailable
        cells: tuple[str | int | None, ...] = (
            p.topic,
            p.region_count,
            p.prune_point,
            p.pruned_entry_id,
            p.log_start_offset,
            p.high_watermark,
            p.reclaimable_entries,
        )
        if with_durability and isinstance(p, wire.Topic):
            cells += (durability(p),)
        style = "bold red" if p.data_loss else ("yellow" if unavailable else "")
        rows.append(Row(cells, why_not_purged(p), style))
    columns = _PLAN_COLUMNS + ((_DURABILITY,) if with_durability else ())
    return Sheet(title, columns, tuple(rows), _WHY, empty="no topics")


_PROCEDURE_COLUMNS = (
    Column("id", "id"),
    Column("kind", "kind", optional=True),
    Column("topic", "topic", topic=True),
    Column("state", "state"),
    Column("step", "step"),
    Column("attempts", "attempts", numeric=True),
    Column("elapsed", "elapsed", numeric=True),
)


def procedure_sheet(procs: Sequence[wire.Procedure], title: str, empty: str = "") -> Sheet:
    rows = tuple(
        Row(
            (p.id, p.kind, p.topic, p.state, p.step, p.attempts, elapsed(p)),
            result(p),
            "red" if p.failed else "",
        )
        for p in procs
    )
    note = Column("error / outcome", "error_or_outcome")
    return Sheet(title, _PROCEDURE_COLUMNS, rows, note, empty=empty)


def steps_sheet(proc: wire.Procedure) -> Sheet:
    rows = tuple(Row((name, f"{seconds:.3f}")) for name, seconds in proc.timings.items())
    columns = (Column("step", "step"), Column("seconds", "seconds", numeric=True))
    return Sheet("Step timings", columns, rows)


_HISTORY_COLUMNS = (
    Column("finished", "finished_at"),
    Column("topic", "topic", topic=True),
    Column("prune point", "prune_point", numeric=True),
    Column("previous", "previous_pruned_entry_id", numeric=True),
    Column("deleted", "entries_deleted", numeric=True),
    Column("bytes", "bytes_estimated", numeric=True, optional=True),
    Column("took", "duration_s", numeric=True),
    Column("procedure", "procedure_id", optional=True),
)


def history_sheet(records: Sequence[wire.PurgeRecord], title: str) -> Sheet:
    rows = tuple(
        Row(
            (
                when(r.finished_at),
                r.topic,
                r.prune_point,
                r.previous_pruned_entry_id,
                f"{r.entries_deleted}{' (logical)' if r.logical_delete else ''}",
                r.bytes_estimated,
                f"{r.duration_s:.2f}s",
                r.procedure_id,
            )
        )
        for r in records
    )
    return Sheet(title, _HISTORY_COLUMNS, rows, empty="no purges")


_EVENT_COLUMNS = (
    Column("at", "at"),
    Column("topic", "topic", topic=True),
    Column("kind", "kind"),
    Column("target", "target", numeric=True),
    Column("start", "log_start_before", numeric=True),
    Column("start after", "log_start_after", numeric=True),
    Column("hwm", "high_watermark", numeric=True),
    Column("region", "region_id", numeric=True, optional=True),
    Column("procedure", "procedure_id", optional=True),
)
_EVENT_STYLES: dict[str, str] = {
    wire.EventKind.WAL_DATA_LOSS.value: "red",
    wire.EventKind.PURGE_FAILED.value: "red",
    wire.EventKind.PURGE_RETRYING.value: "yellow",
}


# Details a column already shows (data-loss events repeat them for older readers).
_SHOWN_DETAILS = frozenset({"procedure_id", "log_start_offset"})


def event_note(event: wire.WalEvent) -> str:
    """The event's message, then its details as `key=value` pairs (JSON values), leaving
    out the empty and false ones and those a column shows."""
    pairs = " ".join(
        f"{k}={json.dumps(v, separators=(',', ':'))}"
        for k, v in sorted(event.details.items())
        if v is not None and v is not False and k not in _SHOWN_DETAILS
    )
    message = event.message or ""
    return f"{message} [{pairs}]" if message and pairs else message or pairs


def event_time(value: datetime) -> str:
    """UTC to the millisecond: one purge's events fall within a second."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def events_sheet(events: Sequence[wire.WalEvent], title: str) -> Sheet:
    rows = tuple(
        Row(
            (
                event_time(e.at),
                e.topic,
                e.kind,
                e.target,
                e.log_start_before,
                e.log_start_after,
                e.high_watermark,
                e.region_id,
                e.procedure_id,
            ),
            event_note(e),
            _EVENT_STYLES.get(e.kind, ""),
        )
        for e in events
    )
    return Sheet(title, _EVENT_COLUMNS, rows, Column("message", "message"), empty="no events")


_REGION_COLUMNS = (
    Column("region_id", "region_id", numeric=True),
    Column("table", "table_id", numeric=True),
    Column("number", "region_number", numeric=True),
    Column("topic", "topic", topic=True),
    Column("node", "node_id", numeric=True),
    Column("flushed", "flushed_entry_id", numeric=True),
    Column("prunable", "prunable_entry_id", numeric=True),
    Column("replay start", "replay_start_entry_id", numeric=True),
)


def region_sheet(regions: Sequence[wire.Region], title: str) -> Sheet:
    rows = tuple(
        Row(
            (
                r.region_id,
                r.region_id >> 32,
                r.region_id & 0xFFFFFFFF,
                r.topic,
                r.node_id,
                None if r.stat is None else r.stat.flushed_entry_id,
                r.prunable_entry_id,
                r.replay_start_entry_id,
            )
        )
        for r in regions
    )
    return Sheet(title, _REGION_COLUMNS, rows, empty="no regions")


def leader_sheet(leader: wire.Leader) -> Sheet:
    columns = (
        Column("leader", "leader"),
        Column("is leader", "is_leader"),
        Column("serving", "serving"),
        Column("term", "term", numeric=True),
        Column("node", "node"),
    )
    cells = (leader.leader, str(leader.is_leader).lower(), str(leader.serving).lower())
    return Sheet("Leader", columns, (Row((*cells, leader.term, leader.node)),))


def findings_sheet(latest: wire.ReconcileLatest) -> Sheet:
    columns = (
        Column("severity", "severity"),
        Column("kind", "kind"),
        Column("topic", "topic", topic=True),
        Column("region", "region_id", numeric=True),
        Column("action", "action", optional=True),
    )
    rows = tuple(
        Row(
            (f.severity, f.kind, f.topic, f.region_id, f.action),
            f.message,
            "bold red" if f.severity == "critical" else "",
        )
        for f in latest.findings
    )
    run = latest.run
    title = (
        f"Reconcile run {run.run_id} ({run.status}, finished {when(run.finished_at)}): "
        f"{latest.matched} finding(s), from {latest.offset + 1 if rows else 0}"
    )
    return Sheet(title, columns, rows, Column("message", "message"), empty="no findings")


def counts_sheet(counts: dict[str, dict[str, int]]) -> Sheet:
    """Findings of a reconcile run: kind x severity."""
    severities = ("critical", "warning", "info")
    columns = (Column("kind", "kind"), *(Column(s, s, numeric=True) for s in severities))
    rows = tuple(Row((kind, *(counts[kind].get(s) for s in severities))) for kind in sorted(counts))
    return Sheet("Findings", columns, rows, empty="No findings.")
