"""The WAL trend sampler (procedures/wal_purge/_trend_sampler.py) on real Kafka, etcd and a
SQL history: what it records, what a purge adds, and what a change of term keeps."""

from __future__ import annotations

import asyncio

from procedures import ProcedureState
from procedures.wal_purge import TrendSampler, submit_purges
from tests._wait import eventually
from tests.procedures._harness import Harness


async def purge(h: Harness, topic: str) -> str:
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    assert (await h.manager.wait(pid, 30)).state is ProcedureState.SUCCEEDED
    return pid


async def test_records_retained_wal_and_the_purges_that_cut_it(leader: Harness) -> None:
    h = leader
    t0, t1 = h.topic(0), h.topic(1)
    await h.register(1, t0)
    await h.register(2, t1)
    h.produce(t0, 30, size=100)
    h.produce(t1, 10, size=100)
    h.report_topic(t0, 29, record_size=30 * 120, record_num=30)  # 120 bytes a record
    term: list[int | None] = [7]
    sampler = TrendSampler(h.services, sample_interval=3600, window=600, term=lambda: term[0])

    await sampler.sample_once()
    by_topic = {s.topic: s for s in sampler.ring.view().series}
    assert set(by_topic) == {t0, t1}  # pool topics without regions are not asked for
    assert by_topic[t0].entries == (30,) and by_topic[t0].bytes == (3600,)
    assert by_topic[t1].entries == (10,) and by_topic[t1].bytes == (None,)  # size unknown

    h.report(1, t0, flushed=19)
    pid = await purge(h, t0)
    await sampler.sample_once()
    view = sampler.ring.view()
    (series,) = [s for s in view.series if s.topic == t0]
    assert series.entries == (30, 11)  # log start 0 -> 19
    assert view.total_entries == (40, 21)
    (mark,) = view.purges
    assert (mark.procedure_id, mark.topic, mark.prune_point, mark.entries_deleted) == (
        pid,
        t0,
        19,
        19,
    )
    assert view.times[0] <= mark.at <= view.times[1]

    # A new term starts afresh: no samples of the old one, its purges read back from SQL.
    term[0] = 8
    await sampler.sample_once()
    view = sampler.ring.view()
    assert len(view.times) == 1
    assert [m.procedure_id for m in view.purges] == [pid]
    # Not leading: nothing kept.
    term[0] = None
    await sampler.sample_once()
    assert len(sampler.ring) == 0 and sampler.ring.view().purges == ()
    assert sampler.term is None


async def test_purges_older_than_the_window_are_not_shown(leader: Harness) -> None:
    h = leader
    t0 = h.topic(0)
    await h.register(1, t0)
    h.produce(t0, 10)
    h.report(1, t0, flushed=5)
    await purge(h, t0)
    sampler = TrendSampler(h.services, sample_interval=1, window=0.5, term=lambda: 1)
    await asyncio.sleep(0.6)  # the behaviour under test: the purge ages past the window
    await sampler.sample_once()
    assert len(sampler.ring) == 1 and sampler.ring.view().purges == ()


async def test_the_loop_samples_every_interval_until_stopped(leader: Harness) -> None:
    h = leader
    await h.register(1, h.topic(0))
    h.produce(h.topic(0), 5)
    sampler = TrendSampler(h.services, sample_interval=0.1, window=60, term=lambda: 1)
    async with sampler:
        loop = sampler.task
        assert loop is not None
        await eventually(lambda: len(sampler.ring) >= 4, "four samples")
    assert loop.done()  # stopped: nothing samples any more
    assert sampler.task is None
    await sampler.stop()  # repeat-safe
