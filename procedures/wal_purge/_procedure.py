"""The WAL purge procedure: prepare -> flush -> purge, one procedure per topic.

- **prepare** plans the topic under its write lock (registrations wait, invariant 4):
  blocked, empty or already purged topics finish as `skipped` with the reason; WAL data
  loss (invariant 7) is recorded as an event and a metric and fails the procedure
  without moving the marker. Regions whose estimated replay bytes
  `(topic latest - prunable) x avg record size` exceed `wal.flush_trigger_size` become
  flush candidates.
- **flush** sends `flush_regions` to the candidates' datanodes (once; persisted), waits
  until each candidate reports a higher prunable id or `wal.flush_wait_timeout` passes,
  then plans again: the new P must pass every check again.
- **purge** persists its intent (target P), moves the marker to P by CAS (monotonic,
  fenced), then deletes below P in Kafka (unless `wal.logical_delete`) and writes the
  purge history row.

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
up to the marker without re-planning: nobody reads below it.

Kafka's log start is the deletion's truth, not the call's answer: after a DeleteRecords
error or timeout the step reads the log start from the partition leader; at or past the
target the deletion is done, below it the step retries.

Resume rule of the purge step (the only step that destroys data). While the marker is
still below the target — in a first run, a retry, or a resume by a new leader — the step
plans again from the CURRENT registry and requires an unblocked plan whose P is >= the
target; if P dropped (a region was registered meanwhile), the target is lowered to the
new P and persisted before the marker moves. After a leader change the registry is
empty, so the plan is blocked until every mapped region has reported again (invariant
3), and the step waits through retries instead of moving anything. Once the marker is at
the target only Kafka's deletion, the history and the metrics remain, and all are safe
without stats. Once the intent is persisted, cancellation no longer stops the procedure.

Each run, retried error and end is recorded as a WAL event (`_events.py`), queued and
written in the background: no step waits for the history database because of them.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from metasrv import keys
from metasrv.errors import MetasrvError, Unavailable, WalDataLoss
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
from procedures.wal_purge._data import PurgeData
from procedures.wal_purge._deletion import delete_below
from procedures.wal_purge._events import attempt_event, emit, terminal_event
from procedures.wal_purge._inputs import PlanInputs, flush_targets, gather_one
from procedures.wal_purge._marker import advance_marker, read_marker
from procedures.wal_purge._plan import describe_blocked, nothing_to_cut
from procedures.wal_purge._services import PurgeServices

logger = logging.getLogger(__name__)

KIND = "wal_purge"
DATA_LOSS_EVENT = EventKind.WAL_DATA_LOSS.value
MAP_LOAD_WAIT = 30.0
"""Seconds a resumed purge waits for the topic-region map to be loaded."""
FLUSH_POLL_INTERVAL = 0.2
"""Seconds between registry checks while waiting for flushed regions to report."""


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

    # -- shared checks ------------------------------------------------------------------

    def _log_extra(self, ctx: StepContext[PurgeServices], step: str) -> dict[str, Any]:
        return {"procedure_id": ctx.procedure_id, "topic": self.data.topic, "step": step}

    def _report_data_loss(self, ctx: StepContext[PurgeServices], inputs: PlanInputs) -> None:
        """One event and one count per region (the event is written in the background)."""
        services = ctx.services
        plan = inputs.plan
        now = time.time()
        # What Kafka held when the loss was found, kept for the failed record and its event
        # (the procedure fails: WalDataLoss is not retried).
        self.data = replace(
            self.data,
            log_start_offset=plan.log_start_offset,
            high_watermark=plan.high_watermark,
        )
        seen = self.data
        for region_id in plan.data_loss:
            stat = inputs.stats.get(region_id)
            details = {
                "procedure_id": ctx.procedure_id,
                "log_start_offset": plan.log_start_offset,
                "prunable_entry_id": None if stat is None else stat.prunable_entry_id,
                "pruned_entry_id": plan.pruned_entry_id,
            }
            message = (
                f"Kafka's log start {plan.log_start_offset} is above entries region "
                f"{region_id} needs (prunable entry id {details['prunable_entry_id']})"
            )
            emit(
                services.events,
                functools.partial(
                    attempt_event,
                    EventKind.WAL_DATA_LOSS,
                    seen,
                    ctx.procedure_id,
                    at=now,
                    message=message,
                    details=details,
                    region_id=region_id,
                ),
            )
            services.metrics.wal_data_loss.labels(topic=self.data.topic).inc()
        logger.error(
            "WAL data loss: Kafka no longer holds entries regions need",
            extra={**self._log_extra(ctx, "plan"), "regions": list(plan.data_loss)},
        )

    async def _plan(self, ctx: StepContext[PurgeServices]) -> PlanInputs:
        """Plan now; WAL data loss is reported and fails the procedure (invariant 7)."""
        inputs = await gather_one(ctx.services, self.data.topic)
        plan = inputs.plan
        if plan.data_loss:
            self._report_data_loss(ctx, inputs)
            raise WalDataLoss(
                f"topic {self.data.topic}: Kafka's log start {plan.log_start_offset} is above "
                f"entries regions {list(plan.data_loss)} still need; marker not advanced",
                details={
                    "regions": list(plan.data_loss),
                    "log_start_offset": plan.log_start_offset,
                },
            )
        return inputs

    def _adopt(self, plan: TopicPlan, *, logical_delete: bool) -> str | None:
        """Record the plan's P; why the purge ends here (blocked, nothing to cut) or None."""
        if plan.prune_point is None:
            return describe_blocked(plan)
        self.data = replace(
            self.data,
            prune_point=plan.prune_point,
            previous_pruned_entry_id=plan.pruned_entry_id,
            log_start_offset=plan.log_start_offset,
            high_watermark=plan.high_watermark,
        )
        return nothing_to_cut(plan, logical_delete=logical_delete)

    # -- steps --------------------------------------------------------------------------

    async def step_prepare(self, ctx: StepContext[PurgeServices]) -> StepResult:
        services = ctx.services
        inputs = await self._plan(ctx)
        if inputs.plan.prune_point is None:
            # Kept for the skip's event: what Kafka held when the topic was found blocked.
            self.data = replace(
                self.data,
                log_start_offset=inputs.plan.log_start_offset,
                high_watermark=inputs.plan.high_watermark,
            )
            return Finish(ProcedureState.SKIPPED, describe_blocked(inputs.plan))
        idle = self._adopt(inputs.plan, logical_delete=services.settings.wal.logical_delete)
        candidates = flush_targets(ctx.services, inputs)
        # An up-to-date topic may still have regions far behind that flush only when asked;
        # skipping before asking them would pin the prune point forever.
        if idle is not None and not candidates:
            return Finish(ProcedureState.SKIPPED, idle)
        self.data = replace(self.data, flush=candidates)
        return Next(PurgeStep.FLUSH if candidates else PurgeStep.PURGE)

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
            self.data = replace(self.data, flush_sent_at=time.time(), flush_instructions=tuple(ids))
            await ctx.save()
        sent_at = self.data.flush_sent_at
        assert sent_at is not None
        deadline = sent_at + wal.flush_wait_timeout
        waiting = {t.region_id: t.prunable_entry_id for t in self.data.flush}
        flushed: set[int] = set()
        while True:
            stats = services.registry.topic_snapshot(self.data.topic)
            for region_id, before in waiting.items():
                stat = stats.get(region_id)
                if stat is not None and stat.prunable_entry_id > before:
                    flushed.add(region_id)
            if len(flushed) == len(waiting) or time.time() >= deadline:
                break
            await ctx.sleep(min(FLUSH_POLL_INTERVAL, max(0.0, deadline - time.time())))
        self.data = replace(self.data, flushed_regions=tuple(sorted(flushed)))
        reason = self._adopt((await self._plan(ctx)).plan, logical_delete=wal.logical_delete)
        if reason is not None:
            return Finish(ProcedureState.SKIPPED, reason)
        return Next(PurgeStep.PURGE)

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

        marker, marker_kv = await read_marker(services, topic)
        offsets = await services.batcher.offsets(topic)
        if marker is None or marker < target:
            if wal.logical_delete or offsets.log_start_offset < target:
                target = await self._revalidate(ctx, target, marker)
                if target is None:
                    return Finish(
                        ProcedureState.SKIPPED,
                        "prune point fell to the marker after regions changed; nothing to purge",
                    )
            if target > offsets.high_watermark:
                # The plan clamps P to the high watermark; never ask Kafka for more (inv. 6).
                raise MetasrvError(
                    f"topic {topic}: target {target} above high watermark {offsets.high_watermark}"
                )
            # Marker first (module docstring): from here on no region replays below it.
            await advance_marker(services, topic, target, current=marker_kv)
        if not wal.logical_delete:
            extra = self._log_extra(ctx, "purge")
            low = await delete_below(
                services.batcher, topic, target, offsets.log_start_offset, extra=extra
            )
            self.data = replace(self.data, low_watermark=low)
        return await self._finish(ctx, target)

    async def _revalidate(
        self, ctx: StepContext[PurgeServices], target: int, marker: int | None
    ) -> int | None:
        """Check `target` against a fresh plan; return the (possibly lowered) target."""
        inputs = await gather_one(ctx.services, self.data.topic, marker=(marker,))
        plan = inputs.plan
        if plan.data_loss:
            self._report_data_loss(ctx, inputs)
            raise WalDataLoss(
                f"topic {self.data.topic}: data loss detected before deleting; nothing deleted",
                details={"regions": list(plan.data_loss)},
            )
        fresh = plan.prune_point
        if fresh is None:
            # After a leader change the registry is empty: wait for every region to report
            # again rather than trust a target computed from a map that may have changed.
            raise Unavailable(
                f"topic {self.data.topic}: cannot re-validate target {target}: "
                f"{describe_blocked(plan)}; waiting for regions to report",
                details={"blocked_by": [b.region_id for b in plan.blocked_by]},
            )
        if fresh >= target:
            return target
        lowered = fresh
        logger.warning(
            "prune point dropped since the intent; lowering the target",
            extra={**self._log_extra(ctx, "purge"), "old": target, "new": lowered},
        )
        if lowered < 0 or (plan.pruned_entry_id is not None and lowered <= plan.pruned_entry_id):
            self.data = replace(self.data, target=None, prune_point=lowered)
            return None
        self.data = replace(self.data, target=lowered, prune_point=lowered)
        await ctx.save()
        return lowered

    async def _finish(self, ctx: StepContext[PurgeServices], target: int) -> StepResult:
        services = ctx.services
        topic = self.data.topic
        wal = services.settings.wal
        previous = self.data.previous_pruned_entry_id
        log_start = self.data.log_start_offset
        # Offsets below the old log start were gone before this purge; with logical
        # deletion, so were (for replay) those below the old marker.
        base = log_start if log_start is not None else 0
        if wal.logical_delete or log_start is None:
            base = max(base, previous if previous is not None else 0)
        entries = max(0, target - base)
        topic_stat = services.registry.topic_stat(topic)
        avg = topic_stat.avg_record_size if topic_stat is not None else 0.0
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
                bytes_estimated=int(entries * avg),
                logical_delete=wal.logical_delete,
                duration_s=max(0.0, now - ctx.submitted_at),
                finished_at=datetime.fromtimestamp(now, tz=UTC),
            )
        )
        services.metrics.purges.labels(topic=topic).inc()
        services.metrics.entries_deleted.labels(topic=topic).inc(entries)
        services.metrics.pruned_entry_id.labels(topic=topic).set(target)
        verb = "released" if wal.logical_delete else "deleted"
        return Finish(
            ProcedureState.SUCCEEDED,
            f"pruned {topic} to {target}: {entries} entries {verb}",
        )
