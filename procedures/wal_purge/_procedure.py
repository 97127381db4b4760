"""The WAL purge procedure: prepare -> flush -> purge, one procedure per topic.

Every step reads, decides, acts: it gathers ONE snapshot of its inputs (`gather_one`: one
marker read, one Kafka offsets read, the map and the stats once), calls the step's pure
decision in `_plan.py` (`decide_prepare`, `decide_after_flush`, `decide_purge`) and does
what the decision value says. No step decides anything itself.

- **prepare** plans the topic under its write lock (registrations wait, invariant 4):
  blocked, empty or already purged topics finish as `skipped` with the reason; WAL data
  loss (invariant 7) is recorded as an event and a metric and fails the procedure
  without moving the marker; a topic reset (invariant 8) is latched into the marker by
  fenced CAS, recorded as a `topic_reset` event and metrics, and fails the procedure
  with `TopicReset` (not retried), deleting nothing. Regions whose estimated replay bytes
  `(topic latest - prunable) x avg record size` exceed `wal.flush_trigger_size` become
  flush candidates.
- **flush** sends `flush_regions` to the candidates' datanodes (once; persisted), waits
  until each candidate reports a higher prunable id or `wal.flush_wait_timeout` passes
  (measured on the monotonic clock; the persisted wall-clock send time only shortens a
  resumed wait), then plans again: the new P must pass every check again.
- **purge** persists its intent (target P), moves the marker to P by CAS (monotonic,
  fenced, recording Kafka's topic id), then deletes below P in Kafka (unless
  `wal.logical_delete`) and writes the purge history row. Prepare persists the Kafka
  topic id it planned on (`PurgeData.topic_id`); offsets of another topic id at the
  flush or purge step are a topic reset, nothing is deleted (a topic recreated during a first
  purge, before any marker recorded its id, would otherwise be cut with the old topic's
  plan).

Marker first, then DeleteRecords. A region replays from `max(flushed, marker) + 1`, so
once the marker is at P no region reads below P + 1 again, and nothing Kafka does with
the deletion can make `replay-start` point below its log start: not a DeleteRecords that
is still waiting for a paused follower (Kafka's partition leader moves its log start
before it waits for the replicas), not one that timed out after deleting, not a new
leader reading the marker the moment after. Moving the marker first is safe because P
was checked against every mapped region just before (invariants 1-3) under the topic's
write lock (invariant 4), P <= the high watermark - 1 (invariant 6), the CAS keeps the
marker monotonic (invariant 5), and data loss is checked before it moves (invariant 7).
A marker ahead of Kafka's log start (the deletion failed, or a new partition leader had
not fetched the log start) is caught up by the next purge of the topic, which deletes
up to the marker without needing stats: nobody reads below it. Unless the topic is a
reset: a recreated topic's log start is not the marker's, so its "gap" is entries
regions wrote since, and nothing is deleted.

Kafka's log start is the deletion's truth, not the call's answer: after a DeleteRecords
error or timeout the step reads the log start from the partition leader; at or past the
target the deletion is done, below it the step retries.

Resume rule of the purge step (the only step that destroys data, `decide_purge`). While
the marker is still below the target — in a first run, a retry, or a resume by a new
leader — the step plans again from the CURRENT registry and requires an unblocked plan
whose P is >= the target; if P dropped (a region was registered meanwhile), the target
is lowered to the new P and persisted before the marker moves. After a leader change the
registry is empty, so the plan is blocked until every mapped region has reported again
(invariant 3), and the step waits through retries instead of moving anything. Once the
marker is at the target only Kafka's deletion, the history and the metrics remain, and
all are safe without stats. Once the intent is persisted, cancellation no longer stops
the procedure.

Pinned consumer groups (DESIGN §8) are re-read by every step with Kafka's offsets
(`gather_one`), the purge step's included, so a persisted target never outruns a group:
the fresh plan's P is bounded by every group's committed offset as read now, and a catch-up
(marker already at the target) deletes only below the lowest of them. A target persisted
before a group was pinned or before its offset was read (a resume) is clamped the same way.

With the WAL archive enabled (DESIGN §8, invariant 10) the purge step, once it has decided
to advance or catch up, lists the topic's archived objects once and deletes nothing unless
they hold [Kafka's log start as it read it, the target) with no gap (`_coverage.py`): a gap
or a store that does not answer ends the purge skipped (`not_archived`) before the marker
moves. Every run of the step (a retry, a resume by a new leader) checks again.

Each run, retried error and end is recorded as a WAL event (`_events.py`), queued and
written in the background: no step waits for the history database because of them.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from metasrv import keys
from metasrv.errors import MetasrvError, TopicReset, Unavailable, WalDataLoss
from metasrv.model import TopicPlan
from metasrv.wire import EventKind, ProcedureState, PurgeRecord
from procedures import (
    Finish,
    Next,
    Procedure,
    ProcedureRecord,
    StepContext,
    StepResult,
)
from procedures.wal_purge._archive import archive_covers, archived_ranges
from procedures.wal_purge._coverage import check_archived
from procedures.wal_purge._data import PurgeData
from procedures.wal_purge._deletion import delete_below
from procedures.wal_purge._events import (
    attempt_event,
    emit,
    loss_event,
    reset_details,
    reset_event,
    terminal_event,
)
from procedures.wal_purge._inputs import PlanInputs, flush_targets, gather_one
from procedures.wal_purge._marker import advance_marker, latch_reset
from procedures.wal_purge._plan import (
    Advance,
    CatchUp,
    Cut,
    Flush,
    Lost,
    Reset,
    Skip,
    Wait,
    decide_after_flush,
    decide_prepare,
    decide_purge,
    entries_freed,
    flush_deadline,
    flushed_regions,
)
from procedures.wal_purge._services import PurgeServices

if TYPE_CHECKING:
    from metasrv.archive import ArchivedRange

logger = logging.getLogger(__name__)

KIND = "wal_purge"
DATA_LOSS_EVENT = EventKind.WAL_DATA_LOSS.value
MAP_LOAD_WAIT = 30.0
"""Seconds a resumed purge waits for the topic-region map to be loaded."""
FLUSH_POLL_INTERVAL = 0.2
"""Seconds between registry checks while waiting for flushed regions to report."""
_ARCHIVE_WAIT = 5.0
"""Seconds a data-loss report waits for the archive's listing of the topic."""


class PurgeStep(enum.Enum):
    """Steps of a WAL purge, in order."""

    PREPARE = "prepare"
    FLUSH = "flush"
    PURGE = "purge"


class WalPurge(Procedure[PurgeData, PurgeServices]):
    """Purge one topic's WAL up to its prune point."""

    kind = KIND
    Step = PurgeStep
    first_step = PurgeStep.PREPARE
    wall_clock: ClassVar[Callable[[], float]] = time.time
    """The wall clock a flush's send time is persisted in (a test steps it back)."""

    @classmethod
    def new(cls, procedure_id: str, topic: str) -> WalPurge:
        return cls(procedure_id, PurgeData(topic=topic))

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> PurgeData:
        return PurgeData.from_json(raw)

    def encode(self) -> dict[str, Any]:
        return self.data.to_json()

    @property
    def topic(self) -> str:
        return self.data.topic

    def kv_locks(self) -> tuple[str, ...]:
        return (keys.lock(self.data.topic),)

    def cancellable(self) -> bool:
        return self.data.target is None

    def on_retry(self, ctx: StepContext[PurgeServices], error: MetasrvError) -> None:
        services = ctx.services
        services.metrics.purge_errors.labels(topic=self.data.topic, kind=error.code).inc()
        emit(
            services.events,
            lambda: attempt_event(
                EventKind.PURGE_RETRYING,
                self.data,
                ctx.procedure_id,
                at=time.time(),
                message=error.message,
                details={"error_code": error.code},
            ),
        )

    @classmethod
    def on_terminal(cls, record: ProcedureRecord, services: PurgeServices) -> None:
        if record.state is ProcedureState.FAILED:
            services.metrics.purge_errors.labels(
                topic=record.topic or "", kind=record.error_code or "internal"
            ).inc()
        emit(
            services.events,
            lambda: terminal_event(
                record,
                PurgeData.from_json(record.data),
                logical_delete=services.settings.wal.logical_delete,
                at=time.time(),
            ),
        )

    @asynccontextmanager
    async def hold(self, ctx: StepContext[PurgeServices]) -> AsyncIterator[None]:
        services = ctx.services
        # A new leader resumes procedures while its election listeners still load the
        # topic-region map; planning from a half-loaded map would be planning blind.
        deadline = time.monotonic() + MAP_LOAD_WAIT
        while not services.region_map.loaded:
            if time.monotonic() > deadline:
                raise Unavailable("topic-region map not loaded yet")
            await asyncio.sleep(0.05)
        # Held from the first step to the end of the run, retries included; a resumed run
        # takes it again before its first step.
        async with services.locks.write(self.data.topic):
            resumed = self.data.prune_point is not None
            emit(
                services.events,
                lambda: attempt_event(
                    EventKind.PURGE_STARTED,
                    self.data,
                    ctx.procedure_id,
                    at=time.time(),
                    details={"resumed": resumed},
                ),
            )
            yield

    # -- shared acts ---------------------------------------------------------------------

    def _log_extra(self, ctx: StepContext[PurgeServices], step: str) -> dict[str, Any]:
        return {"procedure_id": ctx.procedure_id, "topic": self.data.topic, "step": step}

    def _saw(self, plan: TopicPlan, *, kafka_only: bool = False) -> None:
        """Keep what Kafka held when the step planned (for the events and the history),
        and the plan's P and marker when it has a P (unless `kafka_only`)."""
        data = replace(self.data, log_start_offset=plan.log_start_offset)
        self.data = replace(data, high_watermark=plan.high_watermark)
        if plan.prune_point is not None and not kafka_only:
            data = replace(self.data, prune_point=plan.prune_point)
            self.data = replace(data, previous_pruned_entry_id=plan.pruned_entry_id)

    async def _data_loss(
        self, ctx: StepContext[PurgeServices], inputs: PlanInputs, lost: Lost
    ) -> NoReturn:
        """Report WAL data loss (invariant 7): one event and one count per region (the event
        is written in the background, saying whether the WAL archive holds the lost entries:
        one listing of the topic's objects, `_archived_now`); raises `WalDataLoss` (not
        retried)."""
        services = ctx.services
        self._saw(inputs.plan, kafka_only=True)
        seen, now = self.data, time.time()
        archived = await self._archived_now(services, lost)
        pruned = inputs.plan.pruned_entry_id
        for region_id in lost.regions:
            stat = inputs.stats.get(region_id)
            prunable = None if stat is None else stat.prunable_entry_id
            covers = None
            if lost.log_start_offset is not None:
                need = max(-1 if prunable is None else prunable, -1 if pruned is None else pruned)
                covers = archive_covers(archived, need + 1, lost.log_start_offset)
            emit(
                services.events,
                functools.partial(
                    loss_event, seen, ctx.procedure_id, lost, region_id, prunable,
                    pruned_entry_id=pruned, archive_covers=covers, at=now,
                ),
            )  # fmt: skip
            services.metrics.wal_data_loss.labels(topic=seen.topic).inc()
        logger.error(
            "WAL data loss: Kafka no longer holds entries regions need",
            extra={**self._log_extra(ctx, "plan"), "regions": list(lost.regions)},
        )
        raise WalDataLoss(
            f"topic {seen.topic}: Kafka's log start {lost.log_start_offset} is above entries "
            f"regions {list(lost.regions)} still need; marker not advanced, nothing deleted",
            details={"regions": list(lost.regions), "log_start_offset": lost.log_start_offset},
        )

    async def _archived_now(
        self, services: PurgeServices, lost: Lost
    ) -> list[ArchivedRange] | None:
        """The topic's archived ranges, for a data-loss report; None when the archive is
        disabled, there is no log start to compare with, or the store did not answer (the
        report goes out all the same: it says "unknown")."""
        settings = services.settings.wal.archive
        if not settings.enabled or lost.log_start_offset is None:
            return None
        try:
            return await archived_ranges(settings, self.data.topic, timeout=_ARCHIVE_WAIT)
        except MetasrvError as exc:
            logger.warning(
                "WAL data loss: the archive's store did not say what it holds",
                extra={"topic": self.data.topic, "error": str(exc)},
            )
            return None

    async def _topic_reset(
        self, ctx: StepContext[PurgeServices], inputs: PlanInputs, reset: Reset
    ) -> NoReturn:
        """A topic reset (invariant 8): latch it into the marker (fenced CAS), record an
        event and the metrics the first time, delete nothing; raises `TopicReset` (not
        retried: it stays until an operator resolves it)."""
        services = ctx.services
        topic = self.data.topic
        self._saw(inputs.plan, kafka_only=True)
        details = reset_details(reset, inputs.marker)
        latched = await latch_reset(services, topic, reset, current=inputs.marker_kv)
        services.metrics.topic_reset.labels(topic=topic).set(1)
        if latched:
            services.metrics.topic_resets.labels(topic=topic).inc()
            seen, now = self.data, time.time()
            emit(
                services.events, lambda: reset_event(seen, ctx.procedure_id, reset, details, at=now)
            )
            logger.error(
                "topic reset: the topic's offsets went backwards under metasrv",
                extra={**self._log_extra(ctx, "plan"), **details},
            )
        raise TopicReset(
            f"topic {topic} is a topic reset ({reset.reason}); nothing deleted, marker not "
            "moved; an operator must resolve it",
            details=details,
        )

    async def _decided(
        self, ctx: StepContext[PurgeServices], inputs: PlanInputs, decision: Reset | Lost | Skip
    ) -> StepResult:
        """Act on the decisions every step shares: reset and loss fail, skip finishes."""
        if isinstance(decision, Reset):
            await self._topic_reset(ctx, inputs, decision)
        if isinstance(decision, Lost):
            await self._data_loss(ctx, inputs, decision)
        assert isinstance(decision, Skip)
        return Finish(ProcedureState.SKIPPED, decision.reason)

    # -- steps --------------------------------------------------------------------------

    async def step_prepare(self, ctx: StepContext[PurgeServices]) -> StepResult:
        services = ctx.services
        inputs = await gather_one(services, self.data.topic)
        self._saw(inputs.plan)
        # The topic the purge plans on: the purge step cuts nothing of another one.
        self.data = replace(self.data, topic_id=inputs.plan.topic_id)
        decision = decide_prepare(
            inputs.plan,
            flush_targets(services, inputs),
            logical_delete=services.settings.wal.logical_delete,
        )
        if isinstance(decision, Flush):
            self.data = replace(self.data, flush=decision.targets)
            return Next(PurgeStep.FLUSH)
        if isinstance(decision, Cut):
            return Next(PurgeStep.PURGE)
        return await self._decided(ctx, inputs, decision)

    async def step_flush(self, ctx: StepContext[PurgeServices]) -> StepResult:
        services = ctx.services
        wal = services.settings.wal
        if self.data.flush_sent_at is None:
            by_node: dict[int, list[int]] = {}
            for target in self.data.flush:
                by_node.setdefault(target.node_id, []).append(target.region_id)
            ids: list[str] = []
            for node_id, region_ids in sorted(by_node.items()):
                # The mailbox counts `metasrv_flush_instructions_sent` itself.
                ids.append(
                    services.mailbox.send_flush(node_id, region_ids, ttl=wal.flush_wait_timeout)
                )
            sent = type(self).wall_clock()
            self.data = replace(self.data, flush_sent_at=sent, flush_instructions=tuple(ids))
            await ctx.save()
        sent_at = self.data.flush_sent_at
        assert sent_at is not None
        # The monotonic clock bounds the wait: a wall clock stepped back must not hold the
        # topic's lock past the timeout (the wall time only serves a resume).
        deadline = flush_deadline(
            sent_at,
            wal.flush_wait_timeout,
            wall_now=type(self).wall_clock(),
            mono_now=time.monotonic(),
        )
        waiting = {t.region_id: t.prunable_entry_id for t in self.data.flush}
        while True:
            flushed = flushed_regions(waiting, services.registry.topic_snapshot(self.data.topic))
            left = deadline - time.monotonic()
            if len(flushed) == len(waiting) or left <= 0:
                break
            await ctx.sleep(min(FLUSH_POLL_INTERVAL, left))
        self.data = replace(self.data, flushed_regions=tuple(sorted(flushed)))
        inputs = await gather_one(services, self.data.topic)
        self._saw(inputs.plan)
        decision = decide_after_flush(
            inputs.plan, planned_topic_id=self.data.topic_id, logical_delete=wal.logical_delete
        )
        if isinstance(decision, Cut):
            return Next(PurgeStep.PURGE)
        return await self._decided(ctx, inputs, decision)

    async def step_purge(self, ctx: StepContext[PurgeServices]) -> StepResult:
        services = ctx.services
        topic = self.data.topic
        wal = services.settings.wal
        if self.data.target is None:
            assert self.data.prune_point is not None
            # Intent first: a resumed run must know which offset the marker may have taken.
            self.data = replace(self.data, target=self.data.prune_point)
            await ctx.save()
        target = self.data.target
        assert target is not None

        # Read: one marker read, one offsets read, the map and the stats once.
        inputs = await gather_one(services, topic)
        offsets = inputs.offsets
        assert offsets is not None
        # Decide (resume rule in the module docstring).
        decision = decide_purge(
            target,
            inputs.plan,
            planned_topic_id=self.data.topic_id,
            logical_delete=wal.logical_delete,
        )
        # Act.
        if isinstance(decision, Wait):
            details: dict[str, Any] = {"blocked_by": list(decision.regions)}
            if decision.groups:
                details["blocked_by_groups"] = list(decision.groups)
            raise Unavailable(f"topic {topic}: {decision.reason}", details=details)
        if isinstance(decision, Skip):
            self.data = replace(self.data, target=None, prune_point=inputs.plan.prune_point)
            return Finish(ProcedureState.SKIPPED, decision.reason)
        if isinstance(decision, Reset | Lost):
            return await self._decided(ctx, inputs, decision)
        if not wal.logical_delete:
            # Invariant 10: the bucket itself must hold what Kafka would lose, checked after
            # the step's last read and before anything moves (`_coverage.py`).
            blocked = await check_archived(
                services, topic, offsets.log_start_offset, decision.target
            )
            if blocked is not None:
                self.data = replace(self.data, target=None, prune_point=inputs.plan.prune_point)
                return Finish(ProcedureState.SKIPPED, blocked.reason)
        # The marker after this step (the gauge): the target once moved, else as it is.
        marker = inputs.plan.pruned_entry_id
        if isinstance(decision, CatchUp):
            # At most the persisted target, lowered by a pinned group's committed offset.
            target = decision.target
        if isinstance(decision, Advance):
            if decision.lowered:
                logger.warning(
                    "prune point dropped since the intent; lowering the target",
                    extra={**self._log_extra(ctx, "purge"), "old": target, "new": decision.target},
                )
                self.data = replace(self.data, target=decision.target, prune_point=decision.target)
                await ctx.save()
            target = decision.target
            # Marker first (module docstring): from here on no region replays below it.
            await advance_marker(
                services, topic, target, current=inputs.marker_kv, topic_id=offsets.topic_id
            )
            marker = target
        if not wal.logical_delete:
            extra = self._log_extra(ctx, "purge")
            low = await delete_below(
                services.batcher, topic, target, offsets.log_start_offset, extra=extra
            )
            self.data = replace(self.data, low_watermark=low)
        return await self._finish(ctx, target, target if marker is None else marker)

    async def _finish(
        self, ctx: StepContext[PurgeServices], target: int, marker: int
    ) -> StepResult:
        services = ctx.services
        topic = self.data.topic
        wal = services.settings.wal
        previous = self.data.previous_pruned_entry_id
        log_start = self.data.log_start_offset
        entries = entries_freed(target, log_start, previous, logical_delete=wal.logical_delete)
        topic_stat = services.registry.topic_stat(topic)
        now = time.time()
        await services.history.record_purge(
            PurgeRecord(
                procedure_id=ctx.procedure_id,
                topic=topic,
                prune_point=target,
                previous_pruned_entry_id=previous,
                previous_log_start=log_start,
                low_watermark=None if wal.logical_delete else self.data.low_watermark,
                entries_deleted=entries,
                bytes_estimated=0 if topic_stat is None else int(topic_stat.bytes_of(entries)),
                logical_delete=wal.logical_delete,
                duration_s=max(0.0, now - ctx.submitted_at),
                finished_at=datetime.fromtimestamp(now, tz=UTC),
            )
        )
        services.metrics.purges.labels(topic=topic).inc()
        services.metrics.entries_deleted.labels(topic=topic).inc(entries)
        services.metrics.pruned_entry_id.labels(topic=topic).set(marker)
        verb = "released" if wal.logical_delete else "deleted"
        return Finish(
            ProcedureState.SUCCEEDED,
            f"pruned {topic} to {target}: {entries} entries {verb}",
        )
