"""The product's decision functions as the model calls them: the real ones, memoised on
their inputs (they are pure), with the model's state turned into their argument types.

- the plan: `plan_topic` (the marker, Kafka's offsets and topic id and, while the group is
  pinned, its committed offset, as `gather_one` passes them) and the flush targets
  (`flush_candidates`, as `flush_targets` builds them);
- each step's decision: `decide_prepare`, `decide_after_flush`, `decide_purge`;
- the marker values a purge writes: `advanced_marker`, `reset_marker`, through the
  marker codec (`decode_marker` / `encode_marker`);
- replay-start as `GET /v1/regions/{id}/replay-start` answers it (api/queries.py: an
  error while a reset is latched or the marker does not decode, else
  `replay_start_entry_id`), and where the datanode starts reading (`replay_from`);
- the heartbeat judge's regression rule (`regresses`);
- the purge's archive check (`decide_archived`) over the bucket's objects (each run of
  archived offsets as one `ArchivedRange`: `covering` takes any set of objects whose union
  is the same alike).

`Variant.NO_TOPIC_RESET_CHECK` swaps the planner for ef11397's (read from git), the
version the topic-reset bug was filed against. `Variant.IGNORE_PIN` plans without the pinned
group's offset; `Variant.STALE_PIN_AT_PURGE` does so in the purge step only.
`Variant.NO_ARCHIVE_CHECK` never checks the bucket.
"""

from __future__ import annotations

import subprocess
import types
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from metasrv import keys
from metasrv.archive import ArchivedRange
from metasrv.datanode import replay_from
from metasrv.errors import MetasrvError
from metasrv.leader import StatRow, regresses
from metasrv.model import (
    PartitionOffsets,
    RegionRoute,
    RegionStat,
    TopicPlan,
    TopicStat,
    prunable_entry_id,
    replay_start_entry_id,
)
from procedures.wal_purge import (
    AfterFlushDecision,
    FlushTarget,
    NotArchived,
    PrepareDecision,
    PurgeDecision,
    Reset,
    advanced_marker,
    decide_after_flush,
    decide_archived,
    decide_prepare,
    decide_purge,
    flush_candidates,
    plan_topic,
    reset_marker,
)
from tests.procedures.wal_purge.protocol_model._stats import ModelTopicStats
from tests.procedures.wal_purge.protocol_model._world import (
    ABSENT,
    ERROR,
    TOPIC,
    Kafka,
    Stat,
    Variant,
    topic_id,
)

NOW = 1000.0
"""The monotonic instant the model plans at; every stat is received at it (fresh) and
before Kafka's offsets are asked (as `gather_one` orders them)."""
STAT_TTL = 30.0
GROUP = "pinned"
"""The pinned consumer group's name."""
BASE_COMMIT = "ef11397"
"""The code issue #34 was filed against."""

PlanFn = Callable[..., TopicPlan]
Lmap = tuple[int | None, ...]
Stats = tuple[Stat | None, ...]


def archived_ranges(archived: int) -> list[ArchivedRange]:
    """The bucket's objects as the purge's listing parses them: each run of set bits of
    `archived` (bit n: offset n is archived) as one object."""
    ranges: list[ArchivedRange] = []
    offset, first = 0, None
    while archived >> offset:
        held = archived >> offset & 1
        if held and first is None:
            first = offset
        if not held and first is not None:
            ranges.append(ArchivedRange(TOPIC, first, offset - 1))
            first = None
        offset += 1
    if first is not None:
        ranges.append(ArchivedRange(TOPIC, first, offset - 1))
    return ranges


def region_id(index: int) -> int:
    return index + 1


def _row(stat: Stat) -> StatRow:
    flushed, claim = stat
    memtable = 0 if claim is not None else 1
    return StatRow(
        node_id=1,
        topic=TOPIC,
        flushed_entry_id=flushed,
        topic_latest_entry_id=claim,
        memtable_bytes=memtable,
        manifest_version=1,
        received_at=NOW,
        prunable_entry_id=prunable_entry_id(flushed, claim, memtable),
    )


def stat_prunable(stat: Stat) -> int:
    """The stored stat's prunable entry id (`metasrv.model.prunable_entry_id`)."""
    return _row(stat).prunable_entry_id


def accepts(stored: Stat | None, flushed: int) -> bool:
    """Whether the heartbeat judge stores a report of `flushed` over `stored`."""
    return stored is None or not regresses(_row(stored), flushed, 1)


def offsets(kafka: Kafka) -> PartitionOffsets:
    return PartitionOffsets(kafka.log_start, kafka.hwm, topic_id(kafka.inc))


def decoded(marker: bytes | None) -> keys.Marker | None:
    """The stored marker through the real codec (None: never written)."""
    return None if marker is None else keys.decode_marker(marker)


def pruned(marker: bytes | None) -> int | None:
    found = decoded(marker)
    return None if found is None else found.pruned_entry_id


def _ef11397_plan() -> PlanFn:
    root = Path(__file__).resolve().parents[4]
    source = subprocess.run(
        ["git", "-C", str(root), "show", f"{BASE_COMMIT}:procedures/wal_purge/_plan.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("ef11397_plan")
    exec(compile(source, "ef11397:_plan.py", "exec"), module.__dict__)
    old: PlanFn = module.__dict__["plan_topic"]

    def plan(*args: object, marker: object = None, **kwargs: object) -> TopicPlan:
        kwargs.pop("offsets_asked_at", None)
        kwargs.pop("compare_reports", None)
        kwargs.pop("pinned", None)
        return old(*args, **kwargs)

    return plan


class Product:
    """The real decision functions, bound to one variant and memoised."""

    def __init__(self, variant: Variant) -> None:
        self.variant = variant
        self._plan_fn: PlanFn = (
            _ef11397_plan() if Variant.NO_TOPIC_RESET_CHECK in variant else plan_topic
        )
        self.plan = lru_cache(maxsize=None)(self._plan)
        self.flush_targets = lru_cache(maxsize=None)(self._flush_targets)
        self.prepare = lru_cache(maxsize=None)(self._prepare)
        self.after_flush = lru_cache(maxsize=None)(self._after_flush)
        self.purge = lru_cache(maxsize=None)(self._purge)
        self.replay_start = lru_cache(maxsize=None)(self._replay_start)
        self.not_archived = lru_cache(maxsize=None)(self._not_archived)

    def _inputs(self, lmap: Lmap, stats: Stats) -> tuple[dict[int, RegionRoute], ModelTopicStats]:
        routes: dict[int, RegionRoute] = {}
        rows: dict[int, StatRow] = {}
        for i, checkpoint in enumerate(lmap):
            if checkpoint == ABSENT:
                continue
            rid = region_id(i)
            routes[rid] = RegionRoute(rid, TOPIC, 1, checkpoint)
            stat = stats[i]
            if stat is not None:
                rows[rid] = _row(stat)
        return routes, ModelTopicStats(rows)

    def _plan(
        self, lmap: Lmap, stats: Stats, marker: bytes | None, kafka: Kafka, pinned: bool = False
    ) -> TopicPlan:
        """The plan `gather_one` makes: the marker read, the stats copied, then Kafka (the
        offsets, and the group's committed offset while it is `pinned`)."""
        routes, rows = self._inputs(lmap, stats)
        stored = decoded(marker)
        ignored = Variant.IGNORE_PIN in self.variant
        pins = {GROUP: kafka.committed} if pinned and not ignored else None
        return self._plan_fn(
            TOPIC,
            routes,
            rows,
            now=NOW,
            stat_ttl=STAT_TTL,
            pruned_entry_id=None if stored is None else stored.pruned_entry_id,
            offsets=offsets(kafka),
            marker=stored,
            offsets_asked_at=NOW,
            pinned=pins,
        )

    def _flush_targets(self, lmap: Lmap, stats: Stats, kafka: Kafka) -> tuple[FlushTarget, ...]:
        """Regions a purge asks to flush (`flush_targets`): every one behind the topic's
        latest entry (record size 1 byte, flush trigger 0 bytes)."""
        routes, rows = self._inputs(lmap, stats)
        found = flush_candidates(
            list(routes.values()),
            rows,
            topic_stat=TopicStat(TOPIC, kafka.hwm - 1, 1.0, NOW),
            high_watermark=kafka.hwm,
            trigger_bytes=0,
        )
        return tuple(
            FlushTarget(route.region_id, row.node_id, row.prunable_entry_id, replay)
            for route, row, replay in found
        )

    def _prepare(
        self, lmap: Lmap, stats: Stats, marker: bytes | None, kafka: Kafka, pinned: bool
    ) -> tuple[TopicPlan, PrepareDecision]:
        plan = self.plan(lmap, stats, marker, kafka, pinned)
        targets = self.flush_targets(lmap, stats, kafka)
        return plan, decide_prepare(plan, targets, logical_delete=False)

    def _after_flush(
        self,
        planned_topic_id: str | None,
        lmap: Lmap,
        stats: Stats,
        marker: bytes | None,
        kafka: Kafka,
        pinned: bool,
    ) -> tuple[TopicPlan, AfterFlushDecision]:
        """`decide_after_flush` as `step_flush` calls it: a fresh plan and the persisted
        topic id prepare planned on."""
        plan = self.plan(lmap, stats, marker, kafka, pinned)
        return plan, decide_after_flush(
            plan, planned_topic_id=planned_topic_id, logical_delete=False
        )

    def _purge(
        self,
        target: int,
        planned_topic_id: str | None,
        lmap: Lmap,
        stats: Stats,
        marker: bytes | None,
        kafka: Kafka,
        pinned: bool,
    ) -> tuple[TopicPlan, PurgeDecision]:
        """`decide_purge` as `step_purge` calls it: the persisted target and the persisted
        topic id prepare planned on, and a fresh plan."""
        fresh = pinned and Variant.STALE_PIN_AT_PURGE not in self.variant
        plan = self.plan(lmap, stats, marker, kafka, fresh)
        return plan, decide_purge(
            target, plan, planned_topic_id=planned_topic_id, logical_delete=False
        )

    def _not_archived(self, target: int, log_start: int, archived: int) -> NotArchived | None:
        """`check_archived` after the purge step's decision: the bucket's objects listed
        (`archived`, a bit per offset) against [the log start the step read, target); None
        (may delete) always under `NO_ARCHIVE_CHECK`."""
        if Variant.NO_ARCHIVE_CHECK in self.variant:
            return None
        return decide_archived(target, log_start, archived_ranges(archived))

    @staticmethod
    def advanced(marker: bytes | None, target: int, kafka: Kafka) -> bytes | None:
        """The marker value `advance_marker` writes (None: nothing to write); raises
        `TopicReset` as the product does."""
        new = advanced_marker(decoded(marker), target, topic_id(kafka.inc))
        return None if new is None else keys.encode_marker(new, marker)

    @staticmethod
    def latched(marker: bytes | None, reset: Reset) -> bytes | None:
        """The marker value `latch_reset` writes (None: a reset is latched already)."""
        new = reset_marker(decoded(marker), reset)
        return None if new is None else keys.encode_marker(new, marker)

    def _replay_start(
        self,
        index: int,
        stat: Stat | None,
        checkpoint: int | None,
        marker: bytes | None,
        kafka: Kafka,
        in_flight: int | None,
        in_flight_topic_id: str | None = None,
    ) -> int:
        """What `GET /v1/regions/{id}/replay-start` answers (api/queries.py), ERROR for
        an error answer: a marker that does not decode, a reset latched, or one Kafka
        shows now (`plan_topic`'s rule over no regions, as the API asks it); else
        `replay_start_entry_id`, with `in_flight` the persisted target of the topic's
        unfinished purge (the leader's procedure manager holds it); an error when that
        purge planned on a Kafka topic id (`in_flight_topic_id`) that is not Kafka's now
        (`api.queries._check_purge_topic`)."""
        try:
            stored = decoded(marker)
        except ValueError:
            return ERROR
        if stored is not None and stored.reset is not None:
            return ERROR
        if stored is not None and (stored.pruned_entry_id is not None or stored.topic_id):
            _, rows = self._inputs((), ())
            unlatched = self._plan_fn(
                TOPIC,
                {},
                rows,
                now=NOW,
                stat_ttl=STAT_TTL,
                pruned_entry_id=stored.pruned_entry_id,
                offsets=offsets(kafka),
                marker=stored,
                compare_reports=False,
            )
            if unlatched.topic_reset is not None:
                return ERROR
        now_id = offsets(kafka).topic_id
        if in_flight is not None and in_flight_topic_id not in (None, now_id) and now_id:
            return ERROR
        live = None
        if stat is not None:
            row = _row(stat)
            live = RegionStat(
                region_id(index),
                1,
                TOPIC,
                row.flushed_entry_id,
                row.topic_latest_entry_id,
                row.memtable_bytes,
                1,
                NOW,
            )
        try:
            return replay_start_entry_id(
                live, checkpoint, None if stored is None else stored.pruned_entry_id, in_flight
            )
        except MetasrvError:
            return ERROR

    @staticmethod
    def replay_from(answer: int, flushed: int) -> int:
        """Where the datanode's consumer starts (`metasrv.datanode.replay_from`)."""
        return replay_from(answer, flushed)
