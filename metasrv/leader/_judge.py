"""Heartbeat judging: which of a heartbeat's regions are accepted, with which values, and
why the others are rejected, decided before anything is stored.

The regions that have a row under the topic they name (every region of a datanode,
heartbeat after heartbeat) are checked against the stored rows a whole column at a time
(`StatTable.judge`); first reports of mapped regions are accepted a column at a time
too. Only the others (unmapped, moved, negative) are judged region by region. A
heartbeat naming a region twice is a 422.

Per-region rejections (the region is listed, nothing is stored for it, the rest of the
heartbeat is accepted):
- `negative_id`: region_id < 0, or flushed/topic-latest entry id below -1;
- `unknown_region`: not in the topic-region map;
- `topic_mismatch`: reported on a topic other than its mapped one;
- `stat_regressed`: a lower `flushed_entry_id` than the stored stat at the same or a
  newer manifest version (`regresses`: a lower manifest version means the region was
  re-created, and its lower flushed id is the truth);
- `wrong_node`: reported by a datanode other than the one the route names (its old
  datanode after a move, reporting what it last knew: not trusted). A route whose node
  is unknown (-1: a damaged value) trusts any. A region moves by being registered again
  with its new node (`TopicRegionMap.register`), which drops its stored row.

The reporting node is checked a column at a time: a stored row holds the node that
reported it (accepted only from the route's node), and a heartbeat whose slots come
from the memo (`StatTable.recall`: the same regions its datanode was expected to report,
or sent last time and all accepted) needs no check at all, so the steady state pays
nothing for it.
An idle claim sent with a non-empty memtable is accepted but not trusted
(`metasrv.model.prunable_entry_id`) and tallied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, eq
from typing import Any, Final

import numpy as np

from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._region_stats import RowValues, StatRow, regresses
from metasrv.leader._registry import RegionRegistry
from metasrv.model import (
    NULL,
    RegionStat,
    idle_claim_ignored,
    idle_claims_ignored,
    prunable_entry_id,
    prunable_entry_ids,
)
from metasrv.wire import Columns, RegionReport, RejectReason, invalid, reports_as_columns

NEGATIVE_ID: Final = RejectReason.NEGATIVE_ID.value
UNKNOWN_REGION: Final = RejectReason.UNKNOWN_REGION.value
TOPIC_MISMATCH: Final = RejectReason.TOPIC_MISMATCH.value
STAT_REGRESSED: Final = RejectReason.STAT_REGRESSED.value
WRONG_NODE: Final = RejectReason.WRONG_NODE.value
REJECT_REASONS: Final = tuple(reason.value for reason in RejectReason)


@dataclass(slots=True)
class Judged:
    """What one heartbeat's regions come to, before anything is stored."""

    steady: RowValues | None = None
    """Regions with a row under the topic they name."""
    steady_slots: np.ndarray | None = None
    """Their rows' slots, assigned in place (`StatTable.assign`)."""
    fresh: RowValues | None = None
    """Regions reporting for the first time, on their mapped topic."""
    fresh_topics: tuple[list[str], np.ndarray] | None = None
    """Their topics (names, and an index into them per region), for `StatTable.store`."""
    fresh_slots: np.ndarray | None = None
    """Their prepared slots (`StatTable.prepare`), -1 for a region without one."""
    accepted: dict[str, dict[int, StatRow]] = field(default_factory=dict)
    """Rows by topic, of the regions judged one by one (new rows, moved regions)."""
    changed: list[int] = field(default_factory=list)
    """Regions whose prunable id or node changed: their checkpoints are dirty."""
    changed_ids: np.ndarray | None = None
    """The steady regions whose prunable id or node changed (every `fresh` region's
    first checkpoint is dirty too)."""
    rejected: list[dict[str, Any]] = field(default_factory=list)
    misrouted: list[RegionStat] = field(default_factory=list)
    ignored_claims: int = 0
    """Idle claims (`topic_latest_entry_id`) sent with a non-empty memtable."""

    def count(self) -> int:
        columns = sum(len(part.ids) for part in (self.steady, self.fresh) if part is not None)
        return columns + sum(map(len, self.accepted.values()))


def _accepted(cols: Columns, where: np.ndarray, out: Judged) -> RowValues:
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
    no name a heartbeat can carry (and its node is that of no datanode)."""

    topic = None
    node_id = -1


_NO_ROUTE: Final = _Unmapped()
_ROUTE_TOPIC: Final = attrgetter("topic")
_ROUTE_NODE: Final = attrgetter("node_id")


def _duplicate(ids: Iterable[int]) -> int | None:
    seen: set[int] = set()
    for region_id in ids:
        if region_id in seen:
            return region_id
        seen.add(region_id)
    return None


class HeartbeatJudge:
    """Judges a heartbeat's regions against the map and the stored rows (`reports`,
    `columns`); stores nothing."""

    def __init__(
        self, registry: RegionRegistry, region_map: TopicRegionMap, *, keep_misrouted: bool
    ) -> None:
        self._registry = registry
        self._region_map = region_map
        self._keep_misrouted = keep_misrouted
        """Keep the reports of unmapped or misrouted regions (`Judged.misrouted`)."""

    def reports(self, node_id: int, regions: list[RegionReport], now: float) -> Judged:
        """A JSON heartbeat's regions: a column at a time, or region by region when a
        value is `NULL` itself (which a column cannot tell from null)."""
        out = Judged()
        cols = reports_as_columns(regions)
        if cols is None:
            self.one_by_one(node_id, regions, now, out)
            if out.count() + len(out.rejected) != len(regions):
                _refuse_duplicates(r.region_id for r in regions)
        else:
            self.in_columns(node_id, cols, now, out, regions)
        return out

    def columns(self, node_id: int, cols: Columns, now: float) -> Judged:
        """A columns heartbeat's regions (`metasrv.wire`)."""
        out = Judged()
        self.in_columns(node_id, cols, now, out, None)
        return out

    def one_by_one(
        self, node_id: int, regions: list[RegionReport], now: float, out: Judged
    ) -> None:
        """Region by region: accept, reject, or set aside as misrouted."""
        accepted = out.accepted
        changed = out.changed
        rejected = out.rejected
        keep_misrouted = self._keep_misrouted
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
            if old is not None and (old.topic != topic or old.node_id != node_id):
                old = None  # the route decides
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
                if route.node_id != node_id and route.node_id >= 0:
                    rejected.append({"region_id": region_id, "reason": WRONG_NODE})
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

    def in_columns(
        self,
        node_id: int,
        cols: Columns,
        now: float,
        out: Judged,
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
        recalled = slots is not None  # and every one this datanode's (module docstring)
        if slots is None:
            id_list = ids.tolist()
            if len(set(id_list)) != n:
                _refuse_duplicates(id_list)
            slots = table.lookup(id_list, ids)
        flushed = cols.flushed
        latest = cols.latest
        claims = None if latest is None else latest != NULL
        valid = (ids >= 0) & (flushed >= -1)
        if latest is not None and claims is not None:
            valid &= ~claims | (latest >= -1)
        steady, regressed = table.judge(slots, cols.topic_names, cols.topic, flushed, cols.manifest)
        if not recalled:
            # A row another datanode reported is not this one's to update: the route
            # decides (`one_by_one`).
            theirs = table.node_at(np.where(slots >= 0, slots, 0)) != node_id
            steady &= ~theirs
            regressed &= ~theirs
        steady &= valid
        regressed &= valid
        rest = ~(steady | regressed)
        if rest.any():
            first = (slots < 0) | table.prepared_for(slots, cols.topic_names, cols.topic)
            fresh = self._first_reports(
                cols, rest & first & valid, slots, out, None if recalled else node_id
            )
            if fresh is not None:
                rest[fresh] = False
        if rest.any():
            regions = cols.regions() if reports is None else reports
            self.one_by_one(node_id, [regions[i] for i in np.flatnonzero(rest).tolist()], now, out)
        if regressed.any():
            out.rejected.extend(
                {"region_id": rid, "reason": STAT_REGRESSED} for rid in ids[regressed].tolist()
            )
            if rest.any():  # answer in the heartbeat's order, as region by region would
                position = dict(zip(ids.tolist(), range(n), strict=True))
                out.rejected.sort(key=lambda item: position[item["region_id"]])
        if id_list is not None and not rest.any() and _all_prepared(out.fresh_slots):
            # Every region has a row, or a prepared slot that its first report fills now
            # (`StatTable.store` keeps it): worth recalling, from the next heartbeat on.
            table.remember(node_id, ids, slots)  # before `slots` is narrowed to `steady`
        if not steady.any():
            return

        out.steady = accepted = _accepted(cols, steady, out)
        out.steady_slots = held = slots if bool(steady.all()) else slots[steady]
        # Checkpoints hold the prunable id and node: a change in either makes the
        # region dirty. Most heartbeats of an idle region change nothing.
        dirty = table.checkpoint_changed(held, node_id, accepted.prunable)
        if dirty.any():
            out.changed_ids = accepted.ids[dirty]

    def _first_reports(
        self,
        cols: Columns,
        new: np.ndarray,
        slots: np.ndarray,
        out: Judged,
        node_id: int | None,
    ) -> np.ndarray | None:
        """Accept, a column at a time, the regions of `new` (valid ids, no row yet; a
        slot prepared for the topic they name, or none) that the map has on the topic
        they name, routed to `node_id` (None: known to be, recalled slots); return
        their mask (None: there were none). The others (unmapped, misrouted, another
        datanode's) are left to `one_by_one`."""
        at = np.flatnonzero(new)
        if not len(at):
            return None
        names = cols.topic_names
        routes_get = self._region_map.routes.get
        # A slot prepared for the named topic is the map's word (`StatTable.prepare`,
        # the mapped regions when the term began; a removed region's slot is dropped).
        mapped = slots[at] >= 0
        unprepared = np.flatnonzero(~mapped)
        if len(unprepared):
            # Regions mapped during the term: the route, one C-level pass.
            look = at[unprepared]
            named = [names[i] for i in cols.topic[look].tolist()]
            routes = map(routes_get, cols.region_id[look].tolist(), repeat(_NO_ROUTE))
            mapped[unprepared] = np.fromiter(
                map(eq, map(_ROUTE_TOPIC, routes), named), bool, len(look)
            )
        if node_id is not None and mapped.any():
            # The routes' nodes, one C-level pass (a term's first heartbeat of a datanode
            # whose list the memo did not expect, or a region mapped during the term).
            look = at[mapped]
            routes = map(routes_get, cols.region_id[look].tolist(), repeat(_NO_ROUTE))
            nodes = np.fromiter(map(_ROUTE_NODE, routes), np.int64, len(look))
            mapped[mapped] = (nodes == node_id) | (nodes < 0)
        if not mapped.any():
            return None
        new = np.zeros(len(new), bool)
        new[at[mapped]] = True
        out.fresh = _accepted(cols, new, out)
        out.fresh_topics = (names, cols.topic[new])
        out.fresh_slots = slots[new]
        return new


def _all_prepared(fresh_slots: np.ndarray | None) -> bool:
    """No first report, or each one's region has a prepared slot (None: no first report)."""
    return fresh_slots is None or bool((fresh_slots >= 0).all())


def _refuse_duplicates(ids: Iterable[int]) -> None:
    duplicate = _duplicate(ids)
    if duplicate is not None:
        raise invalid(f"region {duplicate} is reported more than once", ["regions", "region_id"])
