"""The purge ticker (procedures/wal_purge/_ticker.py) driving real purges on Kafka + etcd
(and PostgreSQL, where a test takes `leaders`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest

from metasrv import keys
from metasrv.errors import MetasrvError
from metasrv.leader import FIRST_ROUND_CHECK
from procedures import ProcedureState
from procedures.wal_purge import DATA_LOSS_EVENT, PurgeTicker, submit_purges
from tests._metrics import sample
from tests._wait import eventually
from tests.metasrv.kafka._recreate import delete_topic
from tests.procedures._faulty_kv import BACKENDS, LeaderFactory, harnesses_on
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory


@pytest.fixture(params=BACKENDS)
async def leaders(
    request: pytest.FixtureRequest, kafka_bootstrap: str, unique_prefix: str, history_url: str
) -> AsyncIterator[LeaderFactory]:
    """Leaders on each production kv backend (etcd, PostgreSQL)."""
    async with harnesses_on(
        request.param, request, kafka=kafka_bootstrap, prefix=unique_prefix, history_url=history_url
    ) as factory:
        yield factory


async def world(h: Harness) -> list[str]:
    """topic 0 purgeable, topic 1 blocked (no stat), topic 2 already purged."""
    topics = [h.topic(n) for n in range(3)]
    for n, topic in enumerate(topics):
        await h.register(n + 1, topic)
        h.produce(topic, 20)
    h.report(1, topics[0], flushed=10)
    h.report(3, topics[2], flushed=5)
    [pid] = await submit_purges(h.manager, [topics[2]], reason="setup")
    assert (await h.manager.wait(pid, 30)).state is ProcedureState.SUCCEEDED
    return topics


async def test_interval_purges_only_topics_that_can_advance(leader: Harness) -> None:
    h = leader
    topics = await world(h)
    ticker = PurgeTicker(h.manager, interval=0.3, parallelism=4)
    async with ticker:
        await eventually(lambda: h.marker(topics[0]) == 10, "topic 0 purged to 10")
    assert h.offsets(topics[0]).log_start_offset == 10
    assert h.marker(topics[1]) is None
    by_topic = {v.topic: v for v in await h.manager.list() if v.reason == "ticker"}
    assert set(by_topic) == {topics[0]}
    assert sample(h.metrics, "metasrv_wal_prune_point", {"topic": topics[1]}) == -1
    assert sample(h.metrics, "metasrv_wal_blocked_regions", {"topic": topics[1]}) == 1
    await ticker.stop()  # repeat-safe


async def test_parallelism_bounds_in_flight_purges(leader: Harness) -> None:
    h = leader
    topics = [h.topic(n) for n in range(4)]
    for n, topic in enumerate(topics):
        await h.register(n + 1, topic)
        h.produce(topic, 10)
        h.report(n + 1, topic, flushed=5)
    ticker = PurgeTicker(h.manager, interval=3600, parallelism=2)
    async with contextlib.AsyncExitStack() as stack:
        for topic in topics:  # keep every purge from finishing
            await stack.enter_async_context(h.locks.read(topic))
        round_ = asyncio.create_task(ticker.tick())
        # Every purge the round started is queued on its topic's lock. The round's other
        # topics reached the gate before those two purges were even stored: had the gate
        # let them through, they would be submitted by now too.
        await eventually(
            lambda: sum(h.lock_users(t) == 2 for t in topics) == 2,
            "two purges waiting for their topic locks",
        )
        assert len(await h.manager.list()) == 2
    result = await round_
    assert sorted(result.topics) == topics
    assert all(h.marker(t) == 5 for t in topics)


async def test_size_trigger_submits_only_large_reclaimable_topics(leader: Harness) -> None:
    h = leader
    big, small = h.topic(0), h.topic(1)
    for n, topic in enumerate((big, small)):
        await h.register(n + 1, topic)
        h.produce(topic, 60, size=100)
        h.report_topic(topic, 59, record_size=60 * 100, record_num=60)
    h.report(1, big, flushed=50)  # 50 entries x 100 B reclaimable
    h.report(2, small, flushed=5)  # 5 x 100 B
    ticker = PurgeTicker(
        h.manager, interval=0, parallelism=2, size_trigger=1024, size_check_interval=0.2
    )
    assert ticker.enabled
    async with ticker:
        await eventually(lambda: h.marker(big) == 50, "the big topic purged to 50")
        # The round that submitted the big topic's purge had decided on every topic first.
        assert h.marker(small) is None
    assert [v.reason for v in await h.manager.list()] == ["size_trigger"]


async def test_disabled_ticker_does_nothing(leader: Harness) -> None:
    h = leader
    topics = await world(h)
    ticker = PurgeTicker.from_settings(h.manager, h.settings.wal)  # interval "0s", no size
    assert not ticker.enabled
    async with ticker:
        assert ticker.task is None  # no loop: nothing can ever submit a purge
    assert h.marker(topics[0]) is None


async def test_data_loss_is_reported_once_per_loss(leader: Harness) -> None:
    h = leader
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 30)
    h.report(1, topic, flushed=5)
    h.kafka.delete_records({topic: 20})
    ticker = PurgeTicker(h.manager, interval=3600, parallelism=2)

    first = await ticker.tick()
    second = await ticker.tick()

    assert first.topics == (topic,) and second.topics == ()
    [view] = await h.manager.list()
    assert view.state is ProcedureState.FAILED and view.error_code == "wal_data_loss"
    lost = await h.manager.services.events.read(topic=topic, kinds=[DATA_LOSS_EVENT])
    assert len(lost) == 1


async def test_up_to_date_topic_with_a_lagging_region_gets_a_purge(
    harness_factory: HarnessFactory,
) -> None:
    h = await harness_factory(wal={"flush_trigger_size": "1KB", "flush_wait_timeout": "1s"})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 50, size=100)
    h.report_topic(topic, 49, record_size=50 * 100, record_num=50)
    h.report(1, topic, flushed=3)
    ticker = PurgeTicker(h.manager, interval=3600, parallelism=2)
    first = await ticker.tick()  # P = 3 > no marker: purges to 3 (after asking to flush)
    assert first.topics == (topic,) and h.marker(topic) == 3

    second = await ticker.tick()  # P = 3 = marker, yet 46 entries x 100 B to replay
    assert second.topics == (topic,)
    [view] = [v for v in await h.manager.list() if v.id == second.submitted[0]]
    assert view.state is ProcedureState.SKIPPED and view.data["flush"], view


def first_round_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "procedures.wal_purge._ticker"
        and r.getMessage().startswith("first purge round of the term: every mapped region")
    ]


async def test_a_new_terms_first_round_runs_once_every_region_reported(
    leader: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # An hour-long interval: the first round comes from the regions' reports, not the clock.
    h = leader
    topics = [h.topic(n) for n in range(2)]
    for n, topic in enumerate(topics):
        await h.register(n + 1, topic)
        h.produce(topic, 20)
    h.report(1, topics[0], flushed=10)
    ticker = PurgeTicker(h.manager, interval=3600, parallelism=2)
    caplog.set_level(logging.INFO, logger="procedures.wal_purge._ticker")
    checks = 0
    every_region_reported = ticker._every_region_reported

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return every_region_reported()

    ticker._every_region_reported = counted  # type: ignore[method-assign]
    async with ticker:
        # Two checks of the term (FIRST_ROUND_CHECK apart) found region 2 silent: no round.
        await eventually(lambda: checks >= 2, "two first-round checks", timeout=10)
        assert h.marker(topics[0]) is None
        assert first_round_lines(caplog) == []
        h.report(2, topics[1], flushed=8)
        await eventually(
            lambda: h.marker(topics[0]) == 10 and h.marker(topics[1]) == 8,
            "both topics purged",
            timeout=10,
        )
    # The line that says when the round became possible, once, in seconds into the term.
    [line] = first_round_lines(caplog)
    assert line.__dict__["regions"] == 2
    assert FIRST_ROUND_CHECK <= line.__dict__["after_s"] <= 5.0  # two checks, then region 2
    assert f"{line.__dict__['after_s']:.1f} s after the term began" in line.getMessage()


async def test_a_round_stops_waiting_for_a_purge_that_does_not_finish(
    leaders: LeaderFactory,
) -> None:
    # Default bound: 2 x flush_wait_timeout (1 s) + no retries = 2 s.
    h = await leaders(wal={"flush_wait_timeout": "1s"}, procedure={"max_retry_times": 0})
    stuck, free = h.topic(0), h.topic(1)
    for n, topic in enumerate((stuck, free)):
        await h.register(n + 1, topic)
        h.produce(topic, 20)
        h.report(n + 1, topic, flushed=10)
    ticker = PurgeTicker(h.manager, interval=3600, parallelism=2)
    async with h.locks.read(stuck):  # the purge of `stuck` cannot take its topic lock
        started = time.monotonic()
        result = await asyncio.wait_for(ticker.tick(), 15)
        waited = time.monotonic() - started
        assert sorted(result.topics) == [stuck, free]
        [pid] = result.unfinished
        assert (await h.manager.get(pid)).topic == stuck
        assert ticker.wait_timeout == 2.0 and 2.0 <= waited < 10.0
        assert h.marker(free) == 10 and h.marker(stuck) is None
        not_finished = {"topic": stuck, "kind": "not_finished"}
        assert sample(h.metrics, "metasrv_wal_purge_errors_total", not_finished) == 1
    # It was left running, not dropped: it finishes once the lock is free.
    assert (await h.manager.wait(pid, 20)).state is ProcedureState.SUCCEEDED
    assert h.marker(stuck) == 10


async def recreate(h: Harness, topic: str, timeout: float = 60.0) -> None:
    """Delete `topic` and create it again under the same name (offsets from 0)."""
    delete_topic(h.kafka, topic, timeout=timeout)
    await eventually(
        lambda: h.kafka.ensure_topics([topic]) == [topic],
        f"{topic} created",
        timeout=timeout,
        interval=0.2,
        ignore=(MetasrvError,),
    )
    await eventually(
        lambda: h.offsets(topic).high_watermark == 0,
        f"{topic} readable, empty",
        timeout=timeout,
        interval=0.1,
        ignore=(MetasrvError,),
    )


async def test_a_topic_reset_gets_one_purge_per_reset(leaders: LeaderFactory) -> None:
    h = await leaders()
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 20)
    h.report(1, topic, flushed=12)
    ticker = PurgeTicker(h.manager, interval=3600, parallelism=2)
    assert (await ticker.tick()).topics == (topic,) and h.marker(topic) == 12
    # Deleted and recreated under the leader; the region writes 5 entries (offsets 0-4)
    # and reports what it believes.
    await recreate(h, topic)
    h.produce(topic, 5)
    h.report(1, topic, flushed=12, latest=14)

    first = await ticker.tick()
    second = await ticker.tick()
    third = await ticker.tick()

    assert first.topics == (topic,) and second.topics == () and third.topics == ()
    view = await h.manager.get(first.submitted[0])
    assert view.state is ProcedureState.FAILED and view.error_code == "topic_reset", view
    assert h.offsets(topic).log_start_offset == 0  # nothing deleted from the new topic
    resets = await h.manager.services.events.read(topic=topic, kinds=["topic_reset"])
    assert len(resets) == 1

    # Resolved as `POST /v1/topics/{topic}/resolve-reset` leaves it (the marker at
    # {null, <new id>}, the region's stat dropped), the region reports again: the topic
    # purges normally, and a later reset is reported again.
    new_id = h.offsets(topic).topic_id
    h.kv.put(keys.topic_name(topic), keys.encode_marker(keys.Marker(None, new_id, None)))
    h.registry.clear()
    h.report(1, topic, flushed=3)
    assert (await ticker.tick()).topics == (topic,) and h.marker(topic) == 3
    await recreate(h, topic)
    h.produce(topic, 2)
    again = await ticker.tick()
    assert again.topics == (topic,)
    assert (await h.manager.get(again.submitted[0])).error_code == "topic_reset"
