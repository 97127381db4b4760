"""How the operator commands show what the API answers: tables and one-line verdicts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from rich.table import Table

from metasrv import wire


def fmt(value: int | float | None, missing: str = "-") -> str:
    return missing if value is None else str(value)


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def elapsed(proc: wire.Procedure) -> str:
    start = proc.started_at or proc.submitted_at
    if start is None:
        return "-"
    end = proc.finished_at or datetime.now(tz=start.tzinfo)
    return f"{(end - start).total_seconds():.2f}s"


def why_not_purged(plan: wire.TopicPlan) -> str:
    """One line telling an operator what a purge of this topic would do now, or why not."""
    if plan.data_loss:
        regions = ", ".join(str(r) for r in plan.data_loss)
        return f"WAL DATA LOSS: Kafka no longer holds entries needed by region(s) {regions}"
    if plan.kafka_unavailable:
        return f"Kafka unavailable: {plan.kafka_unavailable}"
    if plan.blocked_by:
        reasons = ", ".join(f"region {b.region_id} ({b.reason})" for b in plan.blocked_by)
        return f"blocked by {reasons}"
    if plan.prune_point is None:
        return "no regions mapped" if plan.region_count == 0 else "no prune point"
    if plan.reclaimable_entries <= 0:
        return "up to date: nothing below the prune point left to delete"
    return f"purgeable: {plan.reclaimable_entries} entries below {plan.prune_point}"


# --- tables -----------------------------------------------------------------------------------


def durability(topic: wire.Topic) -> str:
    """`RF/min ISR` as Kafka reports them, `?` where unknown (e.g. `3/2`)."""
    return f"{fmt(topic.replication_factor, '?')}/{fmt(topic.min_insync_replicas, '?')}"


def plan_table(plans: Sequence[wire.TopicPlan], title: str) -> Table:
    """The plans; topic views (`wire.Topic`) also get their `RF/ISR` column."""
    table = Table(title=title, title_justify="left")
    for col in ("topic", "regions", "prune point", "pruned id", "log start", "high wm"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    table.add_column("reclaimable", justify="right")
    with_durability = bool(plans) and all(isinstance(p, wire.Topic) for p in plans)
    if with_durability:
        table.add_column("RF/ISR", justify="right")
    table.add_column("why / blocked regions")
    for p in plans:
        why = why_not_purged(p)
        unavailable = p.blocked_by or p.kafka_unavailable
        style = "bold red" if p.data_loss else ("yellow" if unavailable else "")
        extra = [durability(p)] if isinstance(p, wire.Topic) and with_durability else []
        table.add_row(
            p.topic,
            str(p.region_count),
            fmt(p.prune_point),
            fmt(p.pruned_entry_id),
            fmt(p.log_start_offset),
            fmt(p.high_watermark),
            str(p.reclaimable_entries),
            *extra,
            f"[{style}]{why}[/]" if style else why,
        )
    return table


def result(proc: wire.Procedure) -> str:
    """The error (with its code) of a failed or retrying procedure, else its outcome."""
    if proc.failed or not proc.terminal:
        if proc.error and proc.error_code:
            return f"{proc.error_code}: {proc.error}"
        return proc.error or ""
    return proc.outcome or ""


def procedure_table(procs: Sequence[wire.Procedure], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "kind", "topic", "state", "step", "attempts", "elapsed", "error / outcome"):
        table.add_column(col, overflow="fold")
    for p in procs:
        state = f"[red]{p.state}[/]" if p.failed else p.state
        table.add_row(
            p.id,
            p.kind,
            p.topic or "-",
            state,
            p.step or "-",
            str(p.attempts),
            elapsed(p),
            result(p),
        )
    return table


def history_table(records: Sequence[wire.PurgeRecord], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    cols = ("finished", "topic", "prune point", "previous", "deleted", "bytes", "took", "procedure")
    for col in cols:
        table.add_column(col, overflow="fold")
    for r in records:
        table.add_row(
            when(r.finished_at),
            r.topic,
            str(r.prune_point),
            fmt(r.previous_pruned_entry_id),
            f"{r.entries_deleted}{' (logical)' if r.logical_delete else ''}",
            str(r.bytes_estimated),
            f"{r.duration_s:.2f}s",
            r.procedure_id,
        )
    return table


def events_table(events: Sequence[wire.WalEvent], title: str) -> Table:
    table = Table(title=title, title_justify="left", style="red")
    for col in ("at", "topic", "kind", "region", "details"):
        table.add_column(col, overflow="fold")
    for e in events:
        table.add_row(
            when(e.at),
            e.topic,
            e.kind,
            fmt(e.region_id),
            json.dumps(e.details, sort_keys=True),
        )
    return table
