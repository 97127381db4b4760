"""WAL events in the SQL history, on SQLite and PostgreSQL: the reads' filters, the
background writer's bounds, and retention (`History.trim_events`, `EventRetention`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import create_engine, func, select

import migrations
from metasrv.errors import ConfigError
from metasrv.settings import load_settings
from metasrv.sql import engine_url, wal_events_table
from metasrv.wire import EventKind, WalEvent
from procedures import EventLog, EventRetention, History
from tests._wait import eventually
from tests.metasrv.kv._pgschema import fresh_schema

NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(params=["sqlite", "postgresql"])
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[History]:
    """A migrated history database: a SQLite file, or a fresh PostgreSQL schema."""

    def serve(url: str) -> Iterator[History]:
        migrations.upgrade(url)
        engine = create_engine(engine_url(url))
        try:
            yield History(engine)
        finally:
            engine.dispose()

    if request.param == "sqlite":
        yield from serve(f"sqlite:///{tmp_path / 'history.db'}")
        return
    with fresh_schema(request.getfixturevalue("postgres_url")) as url:
        yield from serve(url)


def event(
    topic: str = "wal_0", kind: EventKind = EventKind.PURGE_STARTED, *, ago: float = 0.0, n: int = 0
) -> WalEvent:
    return WalEvent(
        topic=topic,
        kind=kind.value,
        region_id=None,
        details={"n": n},
        at=NOW - timedelta(seconds=ago),
        procedure_id=f"p{n}",
        target=n,
    )


def count(history: History) -> int:
    with history.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(wal_events_table)).scalar_one())


def dropped(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("dropped_total", {"reason": reason})
    return 0.0 if value is None else value


async def test_reads_filter_by_topic_kinds_and_since_newest_first(history: History) -> None:
    await history.record_events(
        [
            event("a", EventKind.PURGE_STARTED, ago=300, n=1),
            event("a", EventKind.PURGE_DELETED, ago=200, n=2),
            event("b", EventKind.PURGE_FAILED, ago=100, n=3),
            event("a", EventKind.WAL_DATA_LOSS, ago=0, n=4),
        ]
    )
    every = await history.events()
    assert [e.details["n"] for e in every] == [4, 3, 2, 1]
    ids = [e.id for e in every]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == 4
    assert (every[-1].procedure_id, every[-1].target) == ("p1", 1)

    assert [e.details["n"] for e in await history.events(topic="a")] == [4, 2, 1]
    failures = [EventKind.PURGE_FAILED.value, EventKind.WAL_DATA_LOSS.value]
    assert [e.details["n"] for e in await history.events(kinds=failures)] == [4, 3]
    assert [e.details["n"] for e in await history.events(kind="purge_deleted")] == [2]
    recent = NOW - timedelta(seconds=150)
    assert [e.details["n"] for e in await history.events(since=recent)] == [4, 3]
    # The same instant written with another offset: compared in UTC on every database.
    shifted = recent.astimezone(timezone(timedelta(hours=2)))
    assert [e.details["n"] for e in await history.events(since=shifted)] == [4, 3]
    assert [e.details["n"] for e in await history.events(topic="a", since=recent)] == [4]
    assert [e.details["n"] for e in await history.events(limit=1)] == [4]
    assert await history.events(topic="c") == []


async def test_trim_deletes_only_what_is_older_in_batches(history: History) -> None:
    await history.record_events([event(ago=3600 + i, n=i) for i in range(5)])
    await history.record_events([event(ago=10, n=100)])

    deleted = await history.trim_events(NOW - timedelta(seconds=60), batch=2)

    assert deleted == 5
    assert [e.details["n"] for e in await history.events()] == [100]
    assert await history.trim_events(NOW - timedelta(seconds=60)) == 0


async def test_retention_trims_only_while_leading(history: History) -> None:
    leading = False
    retention = EventRetention(history, 60.0, leading=lambda: leading, interval=0.05)
    # The loop trims against the wall clock: ages from now, not from the module's NOW (a
    # long suite imports this module many minutes before the test runs).
    late = (datetime.now(UTC) - NOW).total_seconds()
    await history.record_events([event(ago=3600 - late, n=1), event(ago=1 - late, n=2)])

    assert await retention.trim_once() == 0  # a follower deletes nothing
    assert count(history) == 2
    leading = True
    async with retention:
        await eventually(lambda: count(history) == 1, "the loop trimmed the old event")
    assert [e.details["n"] for e in await history.events()] == [2]


async def test_a_retention_of_zero_keeps_events(history: History) -> None:
    retention = EventRetention(history, 0.0, leading=lambda: True)
    async with retention:
        assert retention.task is None
    assert EventRetention(history, 7 * 86400, leading=lambda: True).interval == 3600
    assert EventRetention(history, 2.0, leading=lambda: True).interval == 1.0


async def test_the_writer_batches_and_drops_the_oldest_past_its_capacity(
    history: History,
) -> None:
    registry = CollectorRegistry()
    log = EventLog(history, Counter("dropped", "", ["reason"], registry=registry), capacity=5)

    for n in range(8):  # no await in between: nothing is written before the fifth
        log.emit(event(n=n))
    assert log.pending == 5
    assert await log.flush(10)

    assert log.pending == 0
    assert [e.details["n"] for e in await history.events()] == [7, 6, 5, 4, 3]
    assert dropped(registry, "overflow") == 3
    assert dropped(registry, "write_failed") == 0


async def test_events_emitted_without_a_loop_are_written_by_the_next_flush(
    history: History,
) -> None:
    log = EventLog(history)
    thread = threading.Thread(target=log.emit, args=(event(n=9),))
    thread.start()
    thread.join()
    assert log.pending == 1
    assert await log.flush(10)
    assert [e.details["n"] for e in await log.read()] == [9]


def test_events_retention_setting() -> None:
    assert load_settings(None).history.events_retention == 7 * 86400
    assert load_settings(None, history={"events_retention": "36h"}).history.events_retention == (
        36 * 3600
    )
    assert load_settings(None, history={"events_retention": "0s"}).history.events_retention == 0
    for bad in ("soon", "-1s", "7 days"):
        with pytest.raises(ConfigError, match="events_retention"):
            load_settings(None, history={"events_retention": bad})
