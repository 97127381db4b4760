"""Heartbeat ingest (DESIGN §5 `POST /v1/heartbeat`): the leader's hot path.

One heartbeat carries a datanode's stats for up to thousands of regions, and the leader
takes hundreds of heartbeats a second, so no Python code runs per region in the steady
state. The body is decoded and type-checked in C by msgspec (`metasrv.wire`); a JSON
body's regions become columns in one C-level pass per field, as the msgpack columns
encoding carries them already. `HeartbeatJudge` (`_judge.py`) then decides, before
anything is stored, what each region comes to: accepted (most a whole column at a time)
or rejected with a reason; a malformed heartbeat, or one naming a region twice, is a 422
and changes nothing. Here the judged heartbeat is stored (`Judged.store`: rows assigned
in place, or stored a column at a time), its changed rows marked for a checkpoint, its
topic reports kept, the mailbox told, the metrics counted, and the answer written.

Topic reports for topics the map does not know are dropped and counted
(`metasrv_topic_reports_ignored_total`); idle claims not trusted are counted in
`metasrv_idle_claims_ignored_total`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from metasrv.leader._checkpoints import Checkpointer
from metasrv.leader._judge import REJECT_REASONS, HeartbeatJudge, Judged
from metasrv.leader._mailbox import Mailbox
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._registry import RegionRegistry
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from metasrv.wire import TopicReport, columns_of, decode_columns, decode_json


class HeartbeatHandler:
    """Validates and applies heartbeats: `handle` (JSON) and `handle_columns` (msgpack
    columns) take a body and return the JSON response body."""

    def __init__(
        self,
        registry: RegionRegistry,
        region_map: TopicRegionMap,
        mailbox: Mailbox,
        checkpointer: Checkpointer,
        metrics: Metrics,
        *,
        leader_addr: Callable[[], str | None],
        clock: Callable[[], float] = time.monotonic,
        on_misrouted: Callable[[list[RegionStat]], None] | None = None,
    ) -> None:
        self._registry = registry
        self._region_map = region_map
        self.judge = HeartbeatJudge(registry, region_map, keep_misrouted=on_misrouted is not None)
        """Decides what each heartbeat's regions come to (`HeartbeatJudge`)."""
        self._mailbox = mailbox
        self._checkpointer = checkpointer
        self._metrics = metrics
        self._leader_addr = leader_addr
        self._clock = clock
        # Reports of unmapped regions, or on a topic other than the mapped one, are stored
        # nowhere here; the stat history keeps them for the reconcile job.
        self._on_misrouted = on_misrouted
        self._heartbeats = metrics.heartbeats
        self._region_stats = metrics.region_stats
        self._rejected = {r: metrics.region_stats_rejected.labels(r) for r in REJECT_REASONS}
        self._ignored_claims = metrics.idle_claims_ignored
        self._unknown_topic_reports = metrics.topic_reports_ignored

    def handle(self, body: bytes) -> bytes:
        """Apply one JSON heartbeat (DESIGN §5); return the JSON response body.

        Raises `InvalidArgument` (HTTP 422) for a body that is not the DESIGN §5 shape
        or names a region twice; nothing is stored in that case.
        """
        doc = decode_json(body)
        now = self._clock()
        judged = self.judge.reports(doc.node_id, doc.regions, now)
        return self._apply(doc.node_id, doc.topics, now, judged)

    def handle_columns(self, body: bytes) -> bytes:
        """Apply one heartbeat in the columns encoding (`metasrv.wire`): the
        same checks and answers as `handle`."""
        doc = decode_columns(body)
        cols = columns_of(doc)
        now = self._clock()
        return self._apply(doc.node_id, doc.topics, now, self.judge.columns(doc.node_id, cols, now))

    def _apply(
        self,
        node_id: int,
        topic_reports: list[TopicReport] | None,
        now: float,
        outcome: Judged,
    ) -> bytes:
        """Store a judged heartbeat and answer it."""
        registry = self._registry
        outcome.store(now)
        if outcome.verdict is not None:
            self._checkpointer.mark_judged(outcome.verdict)
        if topic_reports:
            # Only topics the map knows: reports about any other name would be kept
            # until the next leadership change, however many a client invents.
            known = self._region_map.has_topic
            ignored = 0
            for report in topic_reports:
                if known(report.topic):
                    registry.report_topic(
                        node_id,
                        report.topic,
                        report.latest_entry_id,
                        report.record_size,
                        report.record_num,
                        now,
                    )
                else:
                    ignored += 1
            if ignored:
                self._unknown_topic_reports.inc(ignored)
        mailbox = self._mailbox
        if mailbox.has_pending(node_id):
            mailbox.observe(node_id, outcome.rows())

        self._heartbeats.inc()
        count = outcome.count()
        if count:
            self._region_stats.inc(count)
        if outcome.ignored_claims:
            self._ignored_claims.inc(outcome.ignored_claims)
        for item in outcome.rejected:
            self._rejected[item["reason"]].inc()
        if outcome.misrouted and self._on_misrouted is not None:
            self._on_misrouted(outcome.misrouted)
        return orjson.dumps(
            {
                "leader": self._leader_addr(),
                "instructions": mailbox.pending_wire(node_id),
                "rejected": outcome.rejected,
            }
        )
