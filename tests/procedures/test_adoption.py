"""Unfinished procedure records that no task runs are adopted by the leader's manager, on
the real etcd and PostgreSQL kv backends: a run given up after kv failures, and a create
whose answer was lost and could not be read back. Once the kv is healthy again their
topics are purged again, without a leader change.

The faults come from `FaultyKv` around the real backend (no mock): the run's writes fail
for real, `run_until_settled` gives the run up for real.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from metasrv import keys
from metasrv.errors import KvUnavailable
from metasrv.kv import KvBackend
from procedures import ProcedureState
from procedures.wal_purge import PurgeTicker, submit_purges
from tests._wait import eventually
from tests.procedures._faulty_kv import (
    BACKENDS,
    FaultyKv,
    LeaderFactory,
    creates_procedure,
    harnesses_on,
    saves_procedure,
)
from tests.procedures._harness import Harness


@pytest.fixture(params=BACKENDS)
async def leaders(
    request: pytest.FixtureRequest, kafka_bootstrap: str, unique_prefix: str, history_url: str
) -> AsyncIterator[LeaderFactory]:
    async with harnesses_on(
        request.param, request, kafka=kafka_bootstrap, prefix=unique_prefix, history_url=history_url
    ) as factory:
        yield factory


async def faulty_leader(leaders: LeaderFactory, **overrides: object) -> tuple[Harness, FaultyKv]:
    wrapped: list[FaultyKv] = []

    def wrap(kv: KvBackend) -> KvBackend:
        wrapped.append(FaultyKv(kv))
        return wrapped[0].as_backend()

    # One retry, 10 ms apart: a run is given up after two failed writes.
    procedure = {"max_retry_times": 1, "retry_delay": "10ms", **overrides}
    h = await leaders(wrap=wrap, procedure=procedure)
    return h, wrapped[0]


async def purgeable(h: Harness, n: int = 0) -> str:
    topic = h.topic(n)
    await h.register(n + 1, topic)
    h.produce(topic, 20)
    h.report(n + 1, topic, flushed=12)
    return topic


async def abandoned_purge(h: Harness, faulty: FaultyKv, topic: str) -> str:
    """Submit a purge of `topic` whose every record write fails until it is given up."""
    faulty.fail(saves_procedure, times=None)
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 20)  # wakes when the run is given up, not finished
    assert view.state is ProcedureState.PENDING, view
    assert faulty.hits >= 2
    assert h.kv.get(keys.lock(topic)) is not None  # its lock is still held
    return pid


async def test_a_run_given_up_after_kv_failures_is_adopted_by_the_next_tick(
    leaders: LeaderFactory,
) -> None:
    h, faulty = await faulty_leader(leaders)
    topic = await purgeable(h)
    pid = await abandoned_purge(h, faulty, topic)
    faulty.heal()
    ticker = PurgeTicker(h.manager, interval=3600, parallelism=2)

    result = await asyncio.wait_for(ticker.tick(), 30)

    # The round joins the abandoned purge (its lock), runs it and it purges the topic.
    assert result.submitted == (pid,) and result.unfinished == ()
    view = await h.manager.get(pid)
    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.marker(topic) == 12 and h.offsets(topic).log_start_offset == 12
    assert h.kv.get(keys.lock(topic)) is None


async def test_a_run_given_up_is_adopted_by_the_sweep_without_a_submit(
    leaders: LeaderFactory,
) -> None:
    # finished_ttl 2 s: the sweep (which adopts) runs every 0.5 s.
    h, faulty = await faulty_leader(leaders, finished_ttl="2s")
    topic = await purgeable(h)
    pid = await abandoned_purge(h, faulty, topic)
    faulty.heal()

    await eventually(lambda: h.marker(topic) == 12, "the topic purged to 12")

    assert (await h.manager.wait(pid, 20)).state is ProcedureState.SUCCEEDED
    assert h.offsets(topic).log_start_offset == 12


async def test_a_create_landed_but_unreadable_is_adopted(leaders: LeaderFactory) -> None:
    # The create lands, its answer is lost, and reading it back fails too: the submit
    # raises, and the record it left is run anyway (by the sweep), not left to a new leader.
    h, faulty = await faulty_leader(leaders, finished_ttl="2s")
    topic = await purgeable(h)
    faulty.lose_answer(creates_procedure)
    faulty.fail_gets(100)
    with pytest.raises(KvUnavailable):
        await submit_purges(h.manager, [topic], reason="test")
    faulty.heal()
    [(_, _, result)] = faulty.landed
    assert result.succeeded

    await eventually(lambda: h.marker(topic) == 12, "the topic purged to 12")

    [pid] = [view.id for view in await h.manager.list(topic=topic)]
    view = await h.manager.wait(pid, 20)
    assert view.state is ProcedureState.SUCCEEDED and view.reason == "test"
    assert h.kv.get(keys.lock(topic)) is None


async def test_adopt_runs_a_given_up_run_once(leaders: LeaderFactory) -> None:
    h, faulty = await faulty_leader(leaders)
    topic = await purgeable(h)
    pid = await abandoned_purge(h, faulty, topic)
    faulty.heal()

    adopted = await h.manager.adopt()
    again = await h.manager.adopt()  # it runs now: nothing more to adopt

    assert (adopted, again) == (1, 0)
    assert (await h.manager.wait(pid, 20)).state is ProcedureState.SUCCEEDED
    assert h.marker(topic) == 12
    assert await h.manager.adopt() == 0  # finished: never adopted again
