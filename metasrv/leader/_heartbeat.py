"""Heartbeat ingest (DESIGN §5 `POST /v1/heartbeat`): the leader's hot path.

One heartbeat carries a datanode's stats for up to thousands of regions, and the leader
takes hundreds of heartbeats a second, so no Python code runs per region in the steady
state. The body is decoded and type-checked in C by msgspec (`metasrv.wire`); a JSON
body's regions become columns in one C-level pass per field, as the msgpack columns
encoding carries them already; and the regions that have a row under the topic they
name (every region of a datanode, heartbeat after heartbeat) are checked against the
stored rows and assigned in place a whole column at a time (`metasrv.stat_table`). Only
the others (new, unmapped, moved, negative) are judged region by region. The whole body
is validated before anything is stored: a malformed heartbeat, or one naming a region
twice, is a 422 and changes nothing.

An idle claim (`topic_latest_entry_id`) sent with `memtable_bytes > 0` is stored but not
used for the prune point (`metasrv.model.prunable_entry_id`), and counted in
`metasrv_idle_claims_ignored_total`. Topic reports for topics the map does not know are
dropped and counted (`metasrv_topic_reports_ignored_total`).

Per-region rejections (the region is listed, nothing is stored for it, the rest of the
heartbeat is accepted):
- `negative_id`: region_id < 0, or flushed/topic-latest entry id below -1;
- `unknown_region`: not in the topic-region map;
- `topic_mismatch`: reported on a topic other than its mapped one;
- `stat_regressed`: a lower `flushed_entry_id` than the stored stat at the same or a
  newer manifest version (a lower manifest version means the region was re-created,
  and its lower flushed id is the truth).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, eq
from typing import Any, Final

import numpy as np
import orjson

from metasrv.leader._checkpoints import Checkpointer
from metasrv.leader._mailbox import Mailbox
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._registry import RegionRegistry
from metasrv.leader._stat_table import RowValues, StatRow, regresses
from metasrv.metrics import Metrics
from metasrv.model import (
    NULL,
    RegionStat,
    idle_claim_ignored,
    idle_claims_ignored,
    prunable_entry_id,
    prunable_entry_ids,
)
from metasrv.wire import (
    Columns,
    RegionReport,
    RejectReason,
    TopicReport,
    columns_of,
    decode_columns,
    decode_json,
    invalid,
    reports_as_columns,
)

NEGATIVE_ID: Final = RejectReason.NEGATIVE_ID.value
UNKNOWN_REGION: Final = RejectReason.UNKNOWN_REGION.value
TOPIC_MISMATCH: Final = RejectReason.TOPIC_MISMATCH.value
STAT_REGRESSED: Final = RejectReason.STAT_REGRESSED.value
REJECT_REASONS: Final = tuple(reason.value for reason in RejectReason)


@dataclass(slots=True)
class _Outcome:
    """What one heartbeat's regions come to, before anything is stored."""

    steady: RowValues | None = None
    """Regions with a row under the topic they name."""
    steady_slots: np.ndarray | None = None
    """Their rows' slots, assigned in place (`StatTable.assign`)."""
    fresh: RowValues | None = None
    """Regions reporting for the first time, on their mapped topic."""
    fresh_topics: tuple[list[str], np.ndarray] | None = None
    """Their topics (names, and an index into them per region), for `StatTable.insert`."""
    accepted: dict[str, dict[int, StatRow]] = field(default_factory=dict)
    """Rows by topic, of the regions judged one by one (new rows, moved regions)."""
    changed: list[int] = field(default_factory=list)
    """Regions whose prunable id or node changed: their checkpoints are dirty."""
    rejected: list[dict[str, Any]] = field(default_factory=list)
    misrouted: list[RegionStat] = field(default_factory=list)
    ignored_claims: int = 0
    """Idle claims (`topic_latest_entry_id`) sent with a non-empty memtable."""

    def count(self) -> int:
        columns = sum(len(part.ids) for part in (self.steady, self.fresh) if part is not None)
        return columns + sum(map(len, self.accepted.values()))


def _accepted(cols: Columns, where: np.ndarray, out: _Outcome) -> RowValues:
    """The new values of the regions `where` is true, their prunable ids a column at a
    time (`prunable_entry_ids`); the idle claims not trusted are tallied in `out`."""
    everything = bool(where.all())

    def take(column: np.ndarray) -> np.ndarray:
        return column if everything else column[where]

    flushed, memtable = take(cols.flushed), take(cols.memtable)
    n = len(flushed)
    prunable = flushed
    if cols.latest is None:
        latest = np.full(n, NULL, np.int64)
    else:
        latest = take(cols.latest)
        out.ignored_claims += int(np.count_nonzero(idle_claims_ignored(latest, memtable)))
        prunable = prunable_entry_ids(flushed, latest, memtable)
    manifest = np.full(n, NULL, np.int64) if cols.manifest is None else take(cols.manifest)
    return RowValues(take(cols.region_id), flushed, latest, memtable, manifest, prunable)


class _Unmapped:
    """What `_first_reports` reads for a region the map does not have: its topic equals
    no name a heartbeat can carry."""

    topic = None


_NO_ROUTE: Final = _Unmapped()
_ROUTE_TOPIC: Final = attrgetter("topic")


def _duplicate(ids: Iterable[int]) -> int | None:
    seen: set[int] = set()
    for region_id in ids:
        if region_id in seen:
            return region_id
        seen.add(region_id)
    return None


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
        outcome = _Outcome()
        cols = reports_as_columns(doc.regions)
        if cols is None:
            self._judge(doc.node_id, doc.regions, now, outcome)
            if outcome.count() + len(outcome.rejected) != len(doc.regions):
                self._refuse_duplicates(r.region_id for r in doc.regions)
        else:
            self._judge_columns(doc.node_id, cols, now, outcome, doc.regions)
        return self._apply(doc.node_id, doc.topics, now, outcome)

    def handle_columns(self, body: bytes) -> bytes:
        """Apply one heartbeat in the columns encoding (`metasrv.wire`): the
        same checks and answers as `handle`."""
        doc = decode_columns(body)
        cols = columns_of(doc)
        now = self._clock()
        outcome = _Outcome()
        self._judge_columns(doc.node_id, cols, now, outcome, None)
        return self._apply(doc.node_id, doc.topics, now, outcome)

    @staticmethod
    def _refuse_duplicates(ids: Iterable[int]) -> None:
        duplicate = _duplicate(ids)
        if duplicate is not None:
            raise invalid(
                f"region {duplicate} is reported more than once", ["regions", "region_id"]
            )

    def _judge(self, node_id: int, regions: list[RegionReport], now: float, out: _Outcome) -> None:
        """Region by region: accept, reject, or set aside as misrouted."""
        accepted = out.accepted
        changed = out.changed
        rejected = out.rejected
        keep_misrouted = self._on_misrouted is not None
        route_of = self._region_map.routes.get
        stored = self._registry.table.get
        ignored_claims = 0

        # The hot loop: types and bounds were checked by the decoder; locals only, one
        # allocation per valid region (its row tuple).
        for region in regions:
            region_id = region.region_id
            topic = region.topic
            flushed = region.flushed_entry_id
            latest = region.topic_latest_entry_id
            manifest = region.manifest_version
            memtable = region.memtable_bytes

            if region_id < 0 or flushed < -1 or (latest is not None and latest < -1):
                rejected.append({"region_id": region_id, "reason": NEGATIVE_ID})
                continue
            # The previous row counts only if it names the topic the datanode names.
            # Rows are only stored for mapped regions under their mapped topic and
            # dropped when a region leaves the map (TopicRegionMap removal listeners) or
            # leadership changes, so such a row proves the region is mapped to this
            # topic, and the route lookup is skipped.
            old = stored(region_id)
            if old is not None and old.topic != topic:
                old = None
            if old is not None:
                mapped_topic = old.topic  # equals `topic`: the bucket is keyed by it
                if regresses(old, flushed, manifest):
                    rejected.append({"region_id": region_id, "reason": STAT_REGRESSED})
                    continue
            else:
                route = route_of(region_id)
                if route is None or route.topic != topic:
                    reason = UNKNOWN_REGION if route is None else TOPIC_MISMATCH
                    rejected.append({"region_id": region_id, "reason": reason})
                    if keep_misrouted:
                        out.misrouted.append(
                            RegionStat(
                                region_id, node_id, topic, flushed, latest, memtable, manifest, now
                            )
                        )
                    continue
                mapped_topic = route.topic

            batch = accepted.get(mapped_topic)
            if batch is None:
                batch = accepted[mapped_topic] = {}
            prunable = prunable_entry_id(flushed, latest, memtable)
            if idle_claim_ignored(latest, memtable):
                ignored_claims += 1
            # The route's topic string, not the parsed copy: a million rows share one.
            batch[region_id] = StatRow(
                node_id,
                mapped_topic,
                flushed,
                latest,
                memtable,
                manifest,
                now,
                prunable,
            )
            # Checkpoints hold the prunable id and node: a change in either makes the
            # region dirty. Most heartbeats of an idle region change nothing.
            if old is None or old.prunable_entry_id != prunable or old.node_id != node_id:
                changed.append(region_id)
        out.ignored_claims += ignored_claims

    def _judge_columns(
        self,
        node_id: int,
        cols: Columns,
        now: float,
        out: _Outcome,
        reports: list[RegionReport] | None,
    ) -> None:
        """Judge a heartbeat a column at a time. The regions that have a row under the
        topic they name (the steady state: all of them, heartbeat after heartbeat) are
        checked and accepted whole columns at once, or rejected as `stat_regressed`;
        the rest (negative ids, new, unmapped or moved regions) go to `_judge`, region
        by region. `reports` are the same regions as `RegionReport`s, when at hand."""
        n = len(cols.region_id)
        if n == 0:
            return
        ids = cols.region_id
        table = self._registry.table
        id_list: list[int] | None = None
        slots = table.recall(node_id, ids)  # the same regions as last time: no duplicate
        if slots is None:
            id_list = ids.tolist()
            if len(set(id_list)) != n:
                self._refuse_duplicates(id_list)
            slots = table.lookup(id_list)
        flushed = cols.flushed
        latest = cols.latest
        claims = None if latest is None else latest != NULL
        valid = (ids >= 0) & (flushed >= -1)
        if latest is not None and claims is not None:
            valid &= ~claims | (latest >= -1)
        steady, regressed = table.judge(slots, cols.topic_names, cols.topic, flushed, cols.manifest)
        steady &= valid
        regressed &= valid
        rest = ~(steady | regressed)
        if rest.any():
            fresh = self._first_reports(node_id, cols, rest & (slots < 0) & valid, out)
            if fresh is not None:
                rest[fresh] = False
        if rest.any():
            regions = cols.regions() if reports is None else reports
            self._judge(node_id, [regions[i] for i in np.flatnonzero(rest).tolist()], now, out)
        if regressed.any():
            out.rejected.extend(
                {"region_id": rid, "reason": STAT_REGRESSED} for rid in ids[regressed].tolist()
            )
            if rest.any():  # answer in the heartbeat's order, as region by region would
                position = dict(zip(ids.tolist(), range(n), strict=True))
                out.rejected.sort(key=lambda item: position[item["region_id"]])
        if not steady.any():
            return
        if id_list is not None and not rest.any() and out.fresh is None:
            # Every region has a row (none is new or judged one by one): worth recalling.
            table.remember(node_id, ids, slots)  # before `slots` is narrowed to `steady`

        out.steady = accepted = _accepted(cols, steady, out)
        out.steady_slots = held = slots if bool(steady.all()) else slots[steady]
        # Checkpoints hold the prunable id and node: a change in either makes the
        # region dirty. Most heartbeats of an idle region change nothing.
        dirty = table.checkpoint_changed(held, node_id, accepted.prunable)
        if dirty.any():
            out.changed.extend(accepted.ids[dirty].tolist())

    def _first_reports(
        self, node_id: int, cols: Columns, new: np.ndarray, out: _Outcome
    ) -> np.ndarray | None:
        """Accept, a column at a time, the regions of `new` (valid ids, no row yet) that
        the map has on the topic they name; return their mask (None: there were none).
        The others (unmapped, misrouted) are left to `_judge`."""
        at = np.flatnonzero(new)
        if not len(at):
            return None
        names = cols.topic_names
        named = [names[i] for i in cols.topic[at].tolist()]
        # Mapped on the topic it names, one C-level pass (a new leader hears a million
        # regions for the first time within one heartbeat interval).
        routes = map(self._region_map.routes.get, cols.region_id[at].tolist(), repeat(_NO_ROUTE))
        mapped = np.fromiter(map(eq, map(_ROUTE_TOPIC, routes), named), bool, len(at))
        if not mapped.any():
            return None
        new = np.zeros(len(new), bool)
        new[at[mapped]] = True
        out.fresh = _accepted(cols, new, out)
        out.fresh_topics = (names, cols.topic[new])
        out.changed.extend(out.fresh.ids.tolist())  # a first checkpoint for each
        return new

    def _accepted_rows(self, outcome: _Outcome) -> dict[int, StatRow]:
        """This heartbeat's accepted regions as stored (for the mailbox; built only for
        a datanode with pending instructions)."""
        rows: dict[int, StatRow] = {}
        table = self._registry.table
        for part in (outcome.steady, outcome.fresh):
            if part is not None:
                ids = part.ids.tolist()
                rows.update(zip(ids, table.rows(table.lookup(ids)), strict=True))
        for batch in outcome.accepted.values():
            rows.update(batch)
        return rows

    def _apply(
        self,
        node_id: int,
        topic_reports: list[TopicReport] | None,
        now: float,
        outcome: _Outcome,
    ) -> bytes:
        """Store a judged heartbeat and answer it."""
        registry = self._registry
        table = registry.table
        if outcome.steady is not None and outcome.steady_slots is not None:
            table.assign(outcome.steady_slots, node_id, outcome.steady, now)
        if outcome.fresh is not None and outcome.fresh_topics is not None:
            names, topics = outcome.fresh_topics
            table.insert(outcome.fresh, names, topics, node_id, now)
        registry.put_topic_rows(outcome.accepted)
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
        if outcome.changed:
            self._checkpointer.mark(outcome.changed)
        mailbox = self._mailbox
        if mailbox.has_pending(node_id):
            mailbox.observe(node_id, self._accepted_rows(outcome))

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
