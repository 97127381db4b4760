"""The purge ticker: submits WAL purges on a timer and when reclaimable WAL grows large.

Every `wal.auto_prune_interval` ("0s" disables) the leader plans every topic and submits
a purge for each one whose prune point is above its `pruned_entry_id`; a new leader's first
round runs as soon as every mapped region has reported in its term (an INFO line, "first
purge round of the term", says when, in seconds from the term's start); between those
rounds, when `wal.size_trigger` is set, it checks every `SIZE_CHECK_INTERVAL` seconds
for topics whose estimated reclaimable bytes (reclaimable entries x average record size)
exceed it (the RFC's size-based alternative). At most `wal.auto_prune_parallelism`
purges it submitted run at once, and never two on one topic (the manager returns the
in-flight purge instead). Topics with WAL data loss get a purge too, once per distinct
loss, so the procedure records the event and fails loudly (invariant 7). So does a topic
reset (invariant 8: the plan's `topic_reset`), once per reset: the purge latches it in
the marker, records the event and fails with `TopicReset`; later rounds leave the topic
alone until it is no longer a reset (an operator resolved it), and submit again only if
that purge did not record it (it failed otherwise, or was still running).

A round waits for the purges it submitted, each for at most `wait_timeout` (by default
twice `wal.flush_wait_timeout` plus the retry budget of one step, `ProcedureManager
.retry_budget`): a purge still running then is logged, counted
(`metasrv_wal_purge_errors{kind="not_finished"}`) and left to run, and the round ends,
so no single purge holds back every topic's next round.

Each round also refreshes the per-topic plan gauges (`export_gauges`).
A loop on the ticker (`PeriodicLoop`); only the leader's rounds do anything. When a term
began and whether its first round is in is the leader's `Term`, which the checkpointer
waits on too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Literal

from metasrv.errors import TopicReset
from metasrv.leader import FIRST_ROUND_CHECK, Term
from metasrv.process import ErrorSink, PeriodicLoop, log_only
from metasrv.settings import WalSettings
from procedures import ProcedureManager, ProcedureView
from procedures.wal_purge._gauges import export_gauges
from procedures.wal_purge._inputs import PlanInputs, flush_targets, gather_plans
from procedures.wal_purge._plan import nothing_to_cut
from procedures.wal_purge._services import PurgeServices
from procedures.wal_purge._submit import submit_purges

logger = logging.getLogger(__name__)

SIZE_CHECK_INTERVAL = 10.0
"""Seconds between size-trigger checks (bounded by the interval when that is shorter)."""
NOT_FINISHED = "not_finished"
"""`metasrv_wal_purge_errors` kind of a purge a round stopped waiting for."""


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one round did."""

    planned: int
    """Topics with regions planned."""
    submitted: tuple[str, ...]
    """Procedure ids submitted (or joined, when one was already in flight)."""
    topics: tuple[str, ...]
    """Topics those procedures purge."""
    unfinished: tuple[str, ...] = ()
    """Procedure ids (of `submitted`) still not terminal when the round stopped waiting."""


def default_wait_timeout(manager: ProcedureManager[PurgeServices]) -> float:
    """How long a round waits for one purge: its flush window, as long again for its
    deletion, and one step's retries (`ProcedureManager.retry_budget`)."""
    return 2 * manager.services.settings.wal.flush_wait_timeout + manager.retry_budget


class PurgeTicker(PeriodicLoop):
    """Periodic and size-triggered purge submission on the leader."""

    task_name = "purge-ticker"
    stop_grace = 5.0
    """A round waits on purges; those belong to the manager and keep running."""

    def __init__(
        self,
        manager: ProcedureManager[PurgeServices],
        *,
        interval: float,
        parallelism: int,
        size_trigger: int = 0,
        size_check_interval: float = SIZE_CHECK_INTERVAL,
        wait_timeout: float | None = None,
        on_error: ErrorSink | None = None,
        term: Term | None = None,
    ) -> None:
        if parallelism < 1:
            raise ValueError("parallelism must be >= 1")
        super().__init__(on_error or log_only("ticker"))
        self.wait_timeout = (
            default_wait_timeout(manager) if wait_timeout is None else float(wait_timeout)
        )
        """Seconds a round waits for each purge it submitted (`default_wait_timeout`)."""
        self.manager = manager
        self.services = manager.services
        self.interval = interval
        self.parallelism = parallelism
        self.size_trigger = size_trigger
        self.size_check_interval = size_check_interval
        self.term = term or Term(self.services.region_map, self.services.registry)
        """The leader's term (`Runtime` shares the checkpointer's). Without one the ticker
        begins its own when it sees this process lead."""
        self._begins_term = term is None
        self._period = min(
            interval if interval > 0 else float("inf"),
            size_check_interval if size_trigger > 0 else float("inf"),
        )
        self._state: Literal["following", "first_round", "steady"] = "following"
        self._term_number = -1
        """The term whose rounds this ticker runs."""
        self._next_full = time.monotonic() + interval if interval > 0 else float("inf")
        self._reported_loss: set[tuple[str, int | None, tuple[int, ...]]] = set()
        self._reported_reset: set[str] = set()
        """Topics whose current reset a purge was submitted to record."""

    @classmethod
    def from_settings(
        cls,
        manager: ProcedureManager[PurgeServices],
        wal: WalSettings,
        *,
        on_error: ErrorSink | None = None,
        term: Term | None = None,
    ) -> PurgeTicker:
        return cls(
            manager,
            interval=wal.auto_prune_interval,
            parallelism=wal.auto_prune_parallelism,
            size_trigger=wal.size_trigger,
            on_error=on_error,
            term=term,
        )

    @property
    def enabled(self) -> bool:
        """False when both the interval and the size trigger are off."""
        return self.interval > 0 or self.size_trigger > 0

    def next_round_in(self) -> float:
        # A new term's first round waits for its regions' reports, not an interval.
        return self._period if self._state == "steady" else min(self._period, FIRST_ROUND_CHECK)

    async def round(self) -> None:
        """One wake: nothing on a follower; in a new term, the first round once every
        mapped region reported (one interval at most); then a full round every interval
        and size-triggered ones between."""
        if not self.manager.leading:
            self._state = "following"
            return
        term = self.term
        if self._state == "following" and self._begins_term:
            term.begin()
        if term.number != self._term_number:
            self._term_number = term.number
            if self.interval > 0:
                self._state, self._next_full = "first_round", term.began + self.interval
            else:
                self._state = "steady"  # the size trigger alone: no full round to wait for
        if self._state == "first_round" and time.monotonic() < self._next_full:
            if not self._every_region_reported():
                return
            self._next_full = time.monotonic()
            self._log_first_round(self._next_full - term.began)
        full = time.monotonic() >= self._next_full
        try:
            # Kafka or kv unavailable, or a bug: counted, and the next round tries again.
            await self.tick(size_only=not full)
        finally:
            if full:
                self._next_full, self._state = time.monotonic() + self.interval, "steady"

    def _log_first_round(self, after: float) -> None:
        """Say when a term's first round became possible: `after` seconds from the term's
        start (`Term.began`)."""
        logger.info(
            "first purge round of the term: every mapped region reported, %.1f s after the "
            "term began",
            after,
            extra={"regions": len(self.services.region_map), "after_s": round(after, 3)},
        )

    def _every_region_reported(self) -> bool:
        """`Term.every_region_reported` (DESIGN §2 invariant 3: no purge plans from a
        region it has not heard from)."""
        return self.term.every_region_reported()

    # -- one round ----------------------------------------------------------------------

    def _wanted(self, inputs: PlanInputs, *, size_only: bool) -> bool:
        plan = inputs.plan
        if plan.topic_reset is not None:
            if plan.topic in self._reported_reset:
                return False
            self._reported_reset.add(plan.topic)
            return True
        self._reported_reset.discard(plan.topic)  # resolved: a later reset is reported
        if plan.data_loss:
            key = (plan.topic, plan.log_start_offset, tuple(sorted(plan.data_loss)))
            if key in self._reported_loss:
                return False
            self._reported_loss.add(key)
            return True
        if plan.prune_point is None or plan.high_watermark is None:
            return False  # blocked, no regions, or no offsets from Kafka
        logical = self.services.settings.wal.logical_delete
        if nothing_to_cut(plan, logical_delete=logical) is not None:
            # Nothing to cut now, unless a region far behind is to be asked to flush.
            return not size_only and bool(flush_targets(self.services, inputs))
        if not size_only:
            return True
        stat = self.services.registry.topic_stat(plan.topic)
        return stat is not None and stat.bytes_of(plan.reclaimable_entries) > self.size_trigger

    async def tick(self, *, size_only: bool = False, wait: bool = True) -> TickResult:
        """Plan every topic; submit purges where wanted; optionally wait for them."""
        services = self.services
        if not services.region_map.loaded:
            return TickResult(planned=0, submitted=(), topics=())
        planned = await gather_plans(services)
        plans = {t: inputs.plan for t, inputs in planned.items()}
        export_gauges(services.metrics, plans, services.registry.topic_stats())
        topics: list[str] = []
        for topic, inputs in planned.items():
            if self._wanted(inputs, size_only=size_only):
                topics.append(topic)
            await asyncio.sleep(0)  # one topic at a time between heartbeats
        reason = "size_trigger" if size_only else "ticker"
        gate = asyncio.Semaphore(self.parallelism)
        unfinished: list[str] = []

        async def one(topic: str) -> str:
            async with gate:
                [pid] = await submit_purges(self.manager, [topic], reason=reason)
                if not wait:
                    return pid
                view = await self._waited(pid, topic)
                if view is None:
                    unfinished.append(pid)
                if topic in self._reported_reset and (
                    view is None or view.error_code != TopicReset.code
                ):
                    # Not recorded by this purge: the next round submits one again.
                    self._reported_reset.discard(topic)
                return pid

        ids = await asyncio.gather(*(one(t) for t in topics))
        if topics:
            logger.info(
                "purge round",
                extra={
                    "reason": reason,
                    "topics": len(topics),
                    "planned": len(plans),
                    "unfinished": len(unfinished),
                },
            )
        with_regions = sum(1 for plan in plans.values() if plan.region_count)
        return TickResult(
            planned=with_regions,
            submitted=tuple(ids),
            topics=tuple(topics),
            unfinished=tuple(p for p in ids if p in unfinished),
        )

    async def _waited(self, procedure_id: str, topic: str) -> ProcedureView | None:
        """Wait for a purge, `wait_timeout` at most: its terminal view, or None (logged,
        counted) if it is not terminal by then. It keeps running: a later round finds
        it in flight."""
        view = await self.manager.wait(procedure_id, self.wait_timeout)
        if view.state.terminal:
            return view
        self.services.metrics.purge_errors.labels(topic=topic, kind=NOT_FINISHED).inc()
        logger.warning(
            "purge not finished after %.1f s; the round goes on without it",
            self.wait_timeout,
            extra={"procedure_id": procedure_id, "topic": topic, "state": view.state.value},
        )
        return None
