"""Heartbeat judging: which of a heartbeat's regions are accepted, with which values, and
why the others are rejected, decided before anything is stored.

One path for both encodings and for any number of regions (a JSON heartbeat's regions
become columns first, `metasrv.wire.reports_as_columns`): the stored rows' word on every
region comes from the registry's table a whole column at a time (`StatTable.judge`, a
`Verdict`: which regions have a row under the topic they name that this datanode may
update, and which of those the report would move back); the rules below are applied
here, the others (first reports, unmapped, moved, negative) against the map
(`by_route`), a column at a time too, with one C-level pass over the routes. A heartbeat
naming a region twice is a 422. The accepted regions are stored through the verdict
(`Judged.store`), which alone knows where their rows are.

Per-region rejections (the region is listed, nothing is stored for it, the rest of the
heartbeat is accepted):
- `negative_id`: region_id < 0, or flushed/topic-latest entry id below -1;
- `unknown_region`: not in the topic-region map;
- `topic_mismatch`: reported on a topic other than its mapped one;
- `stat_regressed`: a lower `flushed_entry_id` than the stored stat at the same or a
  newer manifest version (`metasrv.leader._region_stats.regressed`: a lower manifest
  version means the region was re-created, and its lower flushed id is the truth);
- `wrong_node`: reported by a datanode other than the one the route names (its old
  datanode after a move, reporting what it last knew: not trusted). A route whose node
  is unknown (-1: a damaged value) trusts any. A region moves by being registered again
  with its new node (`TopicRegionMap.register`), which drops its stored row.

The reporting node is checked a column at a time: a stored row holds the node that
reported it (accepted only from the route's node), and a heartbeat the table recalls
(`Verdict.recalled`: the same regions its datanode was expected to report, or sent last
time and all accepted) needs no check at all, so the steady state pays nothing for it.
An idle claim sent with a non-empty memtable is accepted but not trusted
(`metasrv.model.prunable_entry_id`) and tallied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, eq, is_
from typing import Any, Final, Protocol

import numpy as np

from metasrv.leader._region_stats import RowValues, StatRow, Verdict, nullable
from metasrv.leader._registry import RegionRegistry
from metasrv.model import (
    NULL,
    RegionRoute,
    RegionStat,
    idle_claims_ignored,
    prunable_entry_ids,
)
from metasrv.wire import Columns, RegionReport, RejectReason, invalid, reports_as_columns

REJECT_REASONS: Final = tuple(reason.value for reason in RejectReason)
_CODE: Final = {reason: code for code, reason in enumerate(RejectReason, start=1)}
"""A rejection's code in a heartbeat's reason column (0: not rejected)."""
_REASON_OF_CODE: Final = ("", *REJECT_REASONS)


class Routes(Protocol):
    """What the judge reads of the topic-region map (`TopicRegionMap`)."""

    @property
    def routes(self) -> Mapping[int, RegionRoute]: ...


@dataclass(slots=True)
class Judged:
    """What one heartbeat's regions come to, before anything is stored."""

    verdict: Verdict | None = None
    """The stored rows' word on the regions (None: the heartbeat named none); it stores
    the accepted ones (`store`)."""
    steady: RowValues | None = None
    """Regions with a row under the topic they name, updated in place."""
    fresh: RowValues | None = None
    """Regions accepted against the map (`HeartbeatJudge.by_route`): first reports, and
    rows another datanode or another topic held."""
    rejected: list[dict[str, Any]] = field(default_factory=list)
    misrouted: list[RegionStat] = field(default_factory=list)
    ignored_claims: int = 0
    """Idle claims (`topic_latest_entry_id`) sent with a non-empty memtable."""

    def count(self) -> int:
        return sum(len(part.ids) for part in (self.steady, self.fresh) if part is not None)

    def store(self, now: float) -> None:
        """Write the accepted regions into the table they were judged against
        (unchanged since), received at `now`."""
        if self.verdict is not None:
            self.verdict.store(now)

    def rows(self) -> dict[int, StatRow]:
        """After `store`: the accepted regions' rows, as stored."""
        return {} if self.verdict is None else self.verdict.rows()


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
    """What `by_route` reads for a region the map does not have: its topic equals no
    name a heartbeat can carry (and its node is that of no datanode)."""

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
        self, registry: RegionRegistry, region_map: Routes, *, keep_misrouted: bool
    ) -> None:
        self._registry = registry
        self._region_map = region_map
        self._keep_misrouted = keep_misrouted
        """Keep the reports of unmapped or misrouted regions (`Judged.misrouted`)."""

    def reports(self, node_id: int, regions: list[RegionReport], now: float) -> Judged:
        """A JSON heartbeat's regions, as columns (`reports_as_columns`)."""
        return self.columns(node_id, reports_as_columns(regions), now)

    def columns(self, node_id: int, cols: Columns, now: float) -> Judged:
        """A columns heartbeat's regions (`metasrv.wire`)."""
        out = Judged()
        self.in_columns(node_id, cols, now, out)
        return out

    def in_columns(self, node_id: int, cols: Columns, now: float, out: Judged) -> None:
        """Judge a heartbeat a column at a time. The regions that have a row under the
        topic they name (the steady state: all of them, heartbeat after heartbeat) are
        checked and accepted whole columns at once, or rejected as `stat_regressed`;
        the rest (negative ids, new, unmapped or moved regions) against the map
        (`by_route`)."""
        n = len(cols.region_id)
        if n == 0:
            return
        ids = cols.region_id
        out.verdict = verdict = self._registry.judge(node_id, cols)
        if not verdict.distinct:
            _refuse_duplicates(ids.tolist())
        flushed = cols.flushed
        latest = cols.latest
        valid = (ids >= 0) & (flushed >= -1)
        if latest is not None:
            valid &= (latest == NULL) | (latest >= -1)
        steady = verdict.steady & valid
        regressed = verdict.regressed & valid
        rest = ~(steady | regressed)
        reasons = np.zeros(n, np.int8)
        reasons[regressed] = _CODE[RejectReason.STAT_REGRESSED]
        remembered = ~rest
        if rest.any():
            reasons[rest & ~valid] = _CODE[RejectReason.NEGATIVE_ID]
            remembered |= self.by_route(node_id, cols, rest & valid, verdict, reasons, out, now)
        if reasons.any():
            rejected = np.flatnonzero(reasons)
            out.rejected = [
                {"region_id": rid, "reason": _REASON_OF_CODE[code]}
                for rid, code in zip(
                    ids[rejected].tolist(), reasons[rejected].tolist(), strict=True
                )
            ]
        if bool(remembered.all()):
            # Every region has a row, or a prepared slot that its first report fills now:
            # worth recalling, from the next heartbeat on.
            verdict.remember()
        if steady.any():
            out.steady = accepted = _accepted(cols, steady, out)
            verdict.accept_steady(steady, accepted)

    def by_route(
        self,
        node_id: int,
        cols: Columns,
        judged: np.ndarray,
        verdict: Verdict,
        reasons: np.ndarray,
        out: Judged,
        now: float,
    ) -> np.ndarray:
        """Judge the regions of `judged` (valid, and no row under the topic they name
        that this datanode reported) against the map: accept as `fresh` those it has on
        the topic they name, routed to `node_id`; set the others' `reasons`. A slot
        prepared for the named topic is the map's word, and in a recalled heartbeat its
        node is too (the memo matched this datanode's mapped regions). Return the mask
        of the regions accepted into a slot prepared for them."""
        at = np.flatnonzero(judged)
        into_prepared = np.zeros(len(judged), bool)
        if not len(at):
            return into_prepared
        names = cols.topic_names
        routes_get = self._region_map.routes.get
        # `StatTable.prepare`: the mapped regions when the term began; a removed
        # region's slot is dropped.
        prepared = verdict.prepared(at)
        mapped = prepared.copy()
        look = np.flatnonzero(~prepared)
        if len(look):
            # The others (mapped during the term, moved, unmapped): their routes, one
            # C-level pass.
            routes = list(map(routes_get, cols.region_id[at[look]].tolist(), repeat(_NO_ROUTE)))
            named = [names[i] for i in cols.topic[at[look]].tolist()]
            on_topic = np.fromiter(map(eq, map(_ROUTE_TOPIC, routes), named), bool, len(look))
            unknown = np.fromiter(map(is_, routes, repeat(_NO_ROUTE)), bool, len(look))
            mapped[look] = on_topic
            reasons[at[look[~on_topic & unknown]]] = _CODE[RejectReason.UNKNOWN_REGION]
            reasons[at[look[~on_topic & ~unknown]]] = _CODE[RejectReason.TOPIC_MISMATCH]
            if self._keep_misrouted and not on_topic.all():
                out.misrouted.extend(_stats(cols, at[look[~on_topic]], node_id, now))
        check = mapped & ~prepared if verdict.recalled else mapped
        if check.any():
            # The routes' nodes, one C-level pass (a term's first heartbeat of a datanode
            # whose list the memo did not expect, or a region mapped during the term).
            look = np.flatnonzero(check)
            checked = map(routes_get, cols.region_id[at[look]].tolist(), repeat(_NO_ROUTE))
            nodes = np.fromiter(map(_ROUTE_NODE, checked), np.int64, len(look))
            wrong = (nodes != node_id) & (nodes >= 0)
            reasons[at[look[wrong]]] = _CODE[RejectReason.WRONG_NODE]
            mapped[look[wrong]] = False
        if not mapped.any():
            return into_prepared
        into_prepared[at[mapped & prepared]] = True
        new = np.zeros(len(judged), bool)
        new[at[mapped]] = True
        out.fresh = accepted = _accepted(cols, new, out)
        verdict.accept_fresh(new, accepted)
        return into_prepared


def _stats(cols: Columns, at: np.ndarray, node_id: int, now: float) -> list[RegionStat]:
    """The reports of the regions at positions `at`, as stats (misrouted: kept for the
    reconcile job)."""
    k = len(at)
    names = cols.topic_names
    latest = [None] * k if cols.latest is None else nullable(cols.latest[at])
    manifest = [None] * k if cols.manifest is None else nullable(cols.manifest[at])
    return [
        RegionStat(region_id, node_id, names[topic], flushed, last, memtable, version, now)
        for region_id, topic, flushed, last, memtable, version in zip(
            cols.region_id[at].tolist(),
            cols.topic[at].tolist(),
            cols.flushed[at].tolist(),
            latest,
            cols.memtable[at].tolist(),
            manifest,
            strict=True,
        )
    ]


def _refuse_duplicates(ids: Iterable[int]) -> None:
    duplicate = _duplicate(ids)
    if duplicate is not None:
        raise invalid(f"region {duplicate} is reported more than once", ["regions", "region_id"])
