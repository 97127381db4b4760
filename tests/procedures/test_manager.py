"""The procedure framework on a real etcd kv and election, with a small test procedure.

`Toy` is a two-step procedure whose steps fail or block on command, so retries, backoff,
cancellation, resume and expiry are tested without depending on Kafka's behaviour.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, ClassVar

import pytest

from metasrv.errors import InvalidArgument, KafkaRejected, NotFound, Unavailable
from procedures import (
    Finish,
    Next,
    Procedure,
    ProcedureRecord,
    ProcedureState,
    StepContext,
    StepResult,
    state_key,
)
from tests._metrics import sample
from tests._wait import eventually
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory


class ToyStep(Enum):
    ONE = "one"
    TWO = "two"


@dataclass(frozen=True)
class ToyData:
    fail: int = 0
    """Times step one raises before succeeding."""
    retryable: bool = True
    next_retry_delay: float | None = None
    crash: bool = False
    block: bool = False
    ran: tuple[str, ...] = ()


class Toy(Procedure[ToyData, object]):
    kind = "toy"
    Step = ToyStep
    first_step = ToyStep.ONE
    gates: ClassVar[dict[str, asyncio.Event]] = {}
    calls: ClassVar[dict[str, list[str]]] = {}

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> ToyData:
        return ToyData(**{**raw, "ran": tuple(raw.get("ran", ()))})

    def encode(self) -> dict[str, Any]:
        d = self.data
        return {
            "fail": d.fail,
            "retryable": d.retryable,
            "next_retry_delay": d.next_retry_delay,
            "crash": d.crash,
            "block": d.block,
            "ran": list(d.ran),
        }

    async def step_one(self, ctx: StepContext[object]) -> StepResult:
        Toy.calls.setdefault(self.id, []).append("one")
        if self.data.block:
            gate = Toy.gates.setdefault(self.id, asyncio.Event())
            while not gate.is_set():
                await ctx.sleep(0.05)  # the toy's work: a step that lasts until the gate opens
        if self.data.crash:
            raise ZeroDivisionError("bug")
        if self.data.fail > 0:
            self.data = replace(self.data, fail=self.data.fail - 1)
            if self.data.retryable:
                raise Unavailable("flaky", next_retry_delay=self.data.next_retry_delay)
            raise KafkaRejected("policy says no")
        self.data = replace(self.data, ran=(*self.data.ran, "one"))
        return Next(ToyStep.TWO)

    async def step_two(self, ctx: StepContext[object]) -> StepResult:
        Toy.calls.setdefault(self.id, []).append("two")
        self.data = replace(self.data, ran=(*self.data.ran, "two"))
        return Finish(ProcedureState.SUCCEEDED, "done")


async def is_running(h: Harness, procedure_id: str) -> bool:
    return (await h.manager.get(procedure_id)).state is ProcedureState.RUNNING


async def toy_leader(factory: HarnessFactory, **overrides: Any) -> Harness:
    return await factory(kinds=[Toy], **overrides)


async def submit(h: Harness, **data: Any) -> str:
    return await h.manager.submit(Toy(uuid.uuid4().hex, ToyData(**data)), reason="test")


async def test_retryable_errors_are_retried_with_backoff(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory, procedure={"retry_delay": "100ms"})
    started = time.monotonic()
    view = await h.manager.wait(await submit(h, fail=3), 30)
    elapsed = time.monotonic() - started

    assert view.state is ProcedureState.SUCCEEDED
    assert [(s.step, s.attempts) for s in view.steps] == [("one", 4), ("two", 1)]
    assert view.steps[0].error == "flaky"
    # Backoff 0.1, 0.2, 0.4 s, each jittered to at least half.
    assert elapsed >= 0.35
    succeeded = {"kind": "toy", "state": "succeeded"}
    assert sample(h.metrics, "metasrv_procedure_duration_seconds_sum", succeeded) > 0


async def test_next_retry_delay_overrides_backoff(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory, procedure={"retry_delay": "10s"})
    started = time.monotonic()
    view = await h.manager.wait(await submit(h, fail=2, next_retry_delay=0.2), 30)
    assert view.state is ProcedureState.SUCCEEDED
    assert 0.4 <= time.monotonic() - started < 5


async def test_non_retryable_error_fails_at_once(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory)
    view = await h.manager.wait(await submit(h, fail=1, retryable=False), 30)
    assert view.state is ProcedureState.FAILED
    assert (view.error_code, view.error, view.attempts) == ("kafka_rejected", "policy says no", 1)


async def test_retries_are_bounded_by_max_retry_times(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory, procedure={"max_retry_times": 2, "retry_delay": "10ms"})
    pid = await submit(h, fail=10)
    view = await h.manager.wait(pid, 30)
    assert view.state is ProcedureState.FAILED
    assert view.error_code == "unavailable" and view.attempts == 3
    assert Toy.calls[pid] == ["one"] * 3


async def test_unexpected_exception_fails_as_internal(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory)
    view = await h.manager.wait(await submit(h, crash=True), 30)
    assert view.state is ProcedureState.FAILED
    assert view.error_code == "internal" and "ZeroDivisionError" in (view.error or "")


async def test_cancel_a_pending_procedure_never_runs_it(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory, procedure={"max_running_procedures": 1})
    blocker = await submit(h, block=True)
    await eventually(lambda: is_running(h, blocker), "blocker running")
    waiting = await submit(h)
    assert (await h.manager.get(waiting)).state is ProcedureState.PENDING

    view = await h.manager.cancel(waiting)
    assert view.state is ProcedureState.CANCELLED
    Toy.gates[blocker].set()
    assert (await h.manager.wait(blocker, 30)).state is ProcedureState.SUCCEEDED
    # The slot went round once more: had the cancelled one still queued for it, it ran first.
    after = await submit(h)
    assert (await h.manager.wait(after, 30)).state is ProcedureState.SUCCEEDED
    assert waiting not in Toy.calls


async def test_cancel_a_running_procedure(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory)
    pid = await submit(h, block=True)
    await eventually(lambda: is_running(h, pid), "pid running")
    view = await h.manager.cancel(pid)
    assert view.state is ProcedureState.CANCELLED
    assert view.finished_at is not None
    stored = await h.manager.services.history.get_procedure(pid)
    assert stored is not None and stored.state is ProcedureState.CANCELLED


async def test_new_leader_resumes_at_the_persisted_step(harness_factory: HarnessFactory) -> None:
    h = await harness_factory(start=False, kinds=[Toy])
    pid = uuid.uuid4().hex
    # What a leader that died after finishing step one left behind.
    record = ProcedureRecord(
        id=pid,
        kind="toy",
        topic=None,
        state=ProcedureState.RUNNING,
        step="two",
        attempts=0,
        reason="test",
        data={"ran": ["one"]},
        submitted_at=time.time() - 5,
        started_at=time.time() - 5,
    )
    h.kv.put(state_key(pid), record.to_json())
    await h.start()

    view = await h.manager.wait(pid, 30)
    assert view.state is ProcedureState.SUCCEEDED
    assert Toy.calls[pid] == ["two"]
    assert view.data["ran"] == ["one", "two"]


async def test_losing_leadership_stops_without_writing_then_resumes(
    harness_factory: HarnessFactory,
) -> None:
    h = await toy_leader(harness_factory)
    pid = await submit(h, block=True)
    await eventually(lambda: is_running(h, pid), "pid running")

    await h.manager.follow()
    stored = await h.manager.store.load(pid)
    assert stored is not None and stored.record.state is ProcedureState.RUNNING
    Toy.gates[pid].set()

    await h.manager.lead()
    view = await h.manager.wait(pid, 30)
    assert view.state is ProcedureState.SUCCEEDED
    assert Toy.calls[pid] == ["one", "one", "two"]


async def test_finished_records_expire_from_kv_but_stay_in_history(
    harness_factory: HarnessFactory,
) -> None:
    h = await toy_leader(harness_factory, procedure={"finished_ttl": "1h"})
    pid = await submit(h)
    assert (await h.manager.wait(pid, 30)).state is ProcedureState.SUCCEEDED
    assert await h.manager.sweep() == 0
    assert h.kv.get(state_key(pid)) is not None

    assert await h.manager.sweep(now=time.time() + 3601) == 1
    assert h.kv.get(state_key(pid)) is None
    view = await h.manager.get(pid)
    assert view.state is ProcedureState.SUCCEEDED and view.outcome == "done"
    assert [v.id for v in await h.manager.list("succeeded")] == [pid]
    assert [s.step for s in view.steps] == ["one", "two"]


async def test_list_and_get(harness_factory: HarnessFactory) -> None:
    h = await toy_leader(harness_factory)
    done = await submit(h)
    await h.manager.wait(done, 30)
    running = await submit(h, block=True)
    await eventually(lambda: is_running(h, running), "running running")

    assert [v.id for v in await h.manager.list()] == [running, done]
    assert [v.id for v in await h.manager.list(ProcedureState.RUNNING)] == [running]
    assert [v.id for v in await h.manager.list("succeeded")] == [done]
    assert await h.manager.list("failed") == []
    with pytest.raises(InvalidArgument):
        await h.manager.list("sleeping")
    with pytest.raises(NotFound):
        await h.manager.get("0" * 32)
    Toy.gates[running].set()
    await h.manager.wait(running, 30)
