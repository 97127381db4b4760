"""What the demo watches and prints: the live topic table, recovery and summary tables."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from rich.table import Table

from metasrv import wire
from metasrv.errors import MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.wire import MetasrvClient
from toolbox.simulator import NodeRecovery, Workload


@dataclass(slots=True)
class Findings:
    """What the demo observed; decides the exit status."""

    recoveries: list[NodeRecovery] = field(default_factory=list)
    lost_entries: dict[str, int] = field(default_factory=dict)
    """Topic -> unflushed acknowledged entries found below Kafka's log start and not in the
    WAL archive."""
    data_loss_reported: set[str] = field(default_factory=set)
    """Topics whose plan reported WAL data loss (other than a trim the archive covers)."""
    trims: list[Trim] = field(default_factory=list)
    """The out-of-band DeleteRecords the demo made, each past a region's need."""
    archived_only: dict[str, int] = field(default_factory=dict)
    """Topic -> most unflushed acknowledged entries seen at once below Kafka's log start but
    in the WAL archive (after a trim): not lost, a restart replays them from the archive."""
    archive_loss_reported: set[str] = field(default_factory=set)
    """Trimmed topics whose plan reported the trim as WAL data loss (the archive holds it)."""
    blocked_during_outage: dict[str, set[int]] = field(default_factory=dict)
    procedures: dict[str, int] = field(default_factory=dict)
    """Procedure states counted over the manual purges."""
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.failure is None
            and not self.lost_entries
            and not self.data_loss_reported
            and all(r.missing == 0 for r in self.recoveries)
        )

    restored_rows: int = 0
    """Acknowledged rows back in the memtables of the datanode restarted after the trim that
    only the WAL archive held (below the trim)."""

    @property
    def archive_records(self) -> int:
        """WAL records the restarts read from the archive (every region's on the topic)."""
        return sum(from_archive(r) for r in self.recoveries)


@dataclass(frozen=True, slots=True)
class Trim:
    """One out-of-band DeleteRecords of the demo: `topic` trimmed to `offset`, with the WAL
    archive holding [`archived_from`, `offset`) (checked by one listing before the trim)."""

    topic: str
    offset: int
    archived_from: int
    need: int
    """The lowest entry a region of the topic still needed when the trim was made."""


class Watcher:
    """Samples the plan and Kafka each tick; checks no needed entry was deleted."""

    def __init__(
        self,
        workload: Workload,
        viewer: MetasrvClient,
        findings: Findings,
        *,
        archive_group: str | None = None,
    ) -> None:
        """`archive_group`: the WAL archive's consumer group, whose committed offset (in the
        plan's pinned groups) the table shows as what is archived."""
        self.workload = workload
        self.viewer = viewer
        self.findings = findings
        self.archive_group = archive_group
        self.admin = KafkaAdmin(workload.kafka_bootstrap)
        self.plans: dict[str, wire.TopicPlan] = {}
        self.purges: dict[str, int] = {}
        self.outage = False
        self.phase = ""

    def close(self) -> None:
        self.admin.close()

    def check_needed_entries(self) -> None:
        """Every acknowledged, unflushed row must still be readable from Kafka, or (below a
        trim the demo made) from the WAL archive."""
        # Log start first, then the regions: a row needed after the read was needed before.
        try:
            offsets = self.admin.offsets(self.workload.topics)
        except MetasrvError:
            return  # a partition without a leader (a broker just died): check next tick

        trims = {t.topic: t for t in self.findings.trims}
        held: dict[str, int] = {}
        for datanode in self.workload.datanodes.values():
            for region in list(datanode.regions.values()):
                below = [
                    e
                    for e in region.unflushed_entry_ids()
                    if e < offsets[region.topic].log_start_offset
                ]
                trim = trims.get(region.topic)
                archived = [e for e in below if trim and trim.archived_from <= e < trim.offset]
                if archived:
                    held[region.topic] = held.get(region.topic, 0) + len(archived)
                lost = len(below) - len(archived)
                if lost:
                    self.findings.lost_entries[region.topic] = (
                        self.findings.lost_entries.get(region.topic, 0) + lost
                    )
        for topic, count in held.items():
            seen = self.findings.archived_only
            seen[topic] = max(seen.get(topic, 0), count)

    def tick(self, _elapsed: float = 0.0) -> None:
        self.check_needed_entries()
        with contextlib.suppress(MetasrvError):
            self.plans = {p.topic: p for p in self.viewer.plan()}
        trimmed = {t.topic for t in self.findings.trims}
        for plan in self.plans.values():
            if plan.data_loss and plan.topic in trimmed:
                # The demo's own trim, which the archive holds: whether every row it cut
                # comes back is what the entries check above and the restarts verify.
                self.findings.archive_loss_reported.add(plan.topic)
            elif plan.data_loss:
                self.findings.data_loss_reported.add(plan.topic)
            if self.outage and plan.blocked_by:
                self.findings.blocked_during_outage.setdefault(plan.topic, set()).update(
                    b.region_id for b in plan.blocked_by if b.region_id is not None
                )

    def table(self) -> Table:
        table = Table(title=f"WAL topics — {self.phase}", title_justify="left")
        table.add_column("topic")
        for column in ("regions", "HW", "archived <", "log start", "P", "pruned", "reclaimable"):
            table.add_column(column, justify="right")
        table.add_column("blocked by")
        for topic in self.workload.topics:
            plan = self.plans.get(topic)
            if plan is None:
                table.add_row(topic, *["-"] * 8)
                continue
            reasons: dict[str, int] = {}
            for b in plan.blocked_by:
                reasons[b.reason] = reasons.get(b.reason, 0) + 1
            blocked = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
            table.add_row(
                topic,
                str(plan.region_count),
                _num(plan.high_watermark),
                _num(self.archived(plan)),
                _num(plan.log_start_offset),
                _num(plan.prune_point),
                _num(plan.pruned_entry_id),
                str(plan.reclaimable_entries),
                f"[yellow]{blocked}[/yellow]" if blocked else "[green]none[/green]",
            )
        return table

    def archived(self, plan: wire.TopicPlan) -> int | None:
        """The archive's committed offset on the topic (every entry below it is archived and
        verified), as the plan's pinned groups saw it; None when unknown."""
        for group in plan.pinned_groups:
            if group.consumer_group == self.archive_group:
                return group.committed_offset
        return None


def from_archive(recovery: NodeRecovery) -> int:
    """Rows a datanode's restart replayed from the WAL archive."""
    return sum(r.from_archive for r in recovery.recoveries)


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def recovery_table(recoveries: list[NodeRecovery]) -> Table:
    table = Table(
        title="Crash recovery (kill, then replay from the metasrv's replay-start)",
        title_justify="left",
    )
    for column in (
        "datanode",
        "regions",
        "acknowledged rows",
        "from SST",
        "replayed",
        "records read from the archive",
        "missing",
    ):
        table.add_column(column, justify="right")
    for rec in recoveries:
        missing = f"[red]{rec.missing}[/red]" if rec.missing else "[green]0[/green]"
        table.add_row(
            str(rec.node_id),
            str(len(rec.verifications)),
            str(rec.acknowledged),
            str(rec.recovered_from_sst),
            str(rec.replayed),
            str(from_archive(rec)),
            missing,
        )
    return table


def summary_table(
    topics: list[str],
    plans: dict[str, wire.TopicPlan],
    history: dict[str, list[wire.PurgeRecord]],
    findings: Findings,
) -> Table:
    table = Table(title="WAL purge summary", title_justify="left")
    table.add_column("topic")
    for column in ("P (pruned)", "HW", "purges", "deleted", "reclaimed"):
        table.add_column(column, justify="right")
    for column in ("blocked now", "blocked in outage", "needed lost"):
        table.add_column(column, justify="right")
    for topic in topics:
        plan = plans.get(topic)
        records = history.get(topic, [])
        lost = findings.lost_entries.get(topic, 0) + (
            1 if topic in findings.data_loss_reported else 0
        )
        table.add_row(
            topic,
            _num(plan.pruned_entry_id if plan else None),
            _num(plan.high_watermark if plan else None),
            str(len(records)),
            str(sum(r.entries_deleted for r in records)),
            _bytes(sum(r.bytes_estimated for r in records)),
            str(len(plan.blocked_by)) if plan else "-",
            str(len(findings.blocked_during_outage.get(topic, set()))),
            f"[red]{lost}[/red]" if lost else "[green]0[/green]",
        )
    return table


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def failure_text(findings: Findings) -> str:
    parts = []
    if findings.failure:
        parts.append(findings.failure)
    missing = sum(r.missing for r in findings.recoveries)
    if missing:
        parts.append(f"{missing} acknowledged rows missing after recovery")
    if findings.lost_entries:
        parts.append(f"needed entries deleted from Kafka: {findings.lost_entries}")
    if findings.data_loss_reported:
        parts.append(f"metasrv reported WAL data loss on {sorted(findings.data_loss_reported)}")
    return "; ".join(parts)


def archive_text(findings: Findings) -> str:
    """What the archive phase showed, in one line for the end of the report."""
    if not findings.trims:
        return "no trim was made: the archive restore did not run"
    trims = ", ".join(f"{t.topic} to {t.offset} (a region needed {t.need})" for t in findings.trims)
    return (
        f"out-of-band DeleteRecords trimmed {trims}; {findings.restored_rows} acknowledged rows "
        f"that only the archive held came back ({findings.archive_records} WAL records read "
        "from it)"
    )
