"""Procedure store CAS and fencing on etcd and SQLite; the SQL history on PostgreSQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine

import migrations
from metasrv import keys
from metasrv.errors import LeadershipLost
from metasrv.kv import Compare, EtcdKv, KvBackend, SqlKv
from metasrv.sql import engine_url
from metasrv.wire import PurgeRecord, WalEvent
from procedures import (
    History,
    ProcedureRecord,
    ProcedureState,
    ProcedureStore,
    RecordConflict,
    StepRun,
)
from tests.metasrv.kv._pgschema import fresh_schema


@pytest.fixture(params=["etcd", "sqlite"])
def kv(request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: str) -> Iterator[KvBackend]:
    backend: KvBackend
    if request.param == "etcd":
        backend = EtcdKv([request.getfixturevalue("etcd_endpoint")], f"{unique_prefix}/")
    else:
        url = f"sqlite:///{tmp_path / 'kv.db'}"
        migrations.upgrade(url)
        backend = SqlKv(url, "")
    try:
        yield backend
    finally:
        backend.delete_prefix("")
        backend.close()


def record(topic: str = "wal_0", **changes: object) -> ProcedureRecord:
    base = ProcedureRecord(
        id=uuid.uuid4().hex,
        kind="wal_purge",
        topic=topic,
        state=ProcedureState.PENDING,
        step="prepare",
        attempts=0,
        reason="test",
        data={"topic": topic},
        submitted_at=time.time(),
        kv_locks=(keys.lock(topic),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def leader_fence(kv: KvBackend) -> list[Compare]:
    return [Compare(keys.ELECTION_KEY, value=b"me")]


async def test_create_takes_lock_and_second_create_names_the_holder(kv: KvBackend) -> None:
    kv.put(keys.ELECTION_KEY, b"me")
    store = ProcedureStore(kv, lambda: leader_fence(kv))
    first = record()
    made = await store.create(first)
    assert made.created and made.procedure_id == first.id
    again = await store.create(record())
    assert not again.created and again.procedure_id == first.id
    assert await store.lock_holder(keys.lock("wal_0")) == first.id


async def test_save_is_compare_and_swap_and_terminal_drops_lock(kv: KvBackend) -> None:
    kv.put(keys.ELECTION_KEY, b"me")
    store = ProcedureStore(kv, lambda: leader_fence(kv))
    rec = record()
    rev = (await store.create(rec)).revision
    running = replace(rec, state=ProcedureState.RUNNING)
    rev2 = await store.save(running, rev)
    assert rev2 > rev
    with pytest.raises(RecordConflict):
        await store.save(running, rev)  # stale revision
    done = replace(running, state=ProcedureState.SUCCEEDED, finished_at=time.time())
    await store.save(done, rev2)
    assert kv.get(keys.lock("wal_0")) is None
    loaded = await store.load(rec.id)
    assert loaded is not None and loaded.record == done


async def test_deposed_leader_cannot_write(kv: KvBackend) -> None:
    kv.put(keys.ELECTION_KEY, b"someone-else")
    store = ProcedureStore(kv, lambda: leader_fence(kv))
    with pytest.raises(LeadershipLost):
        await store.create(record())
    assert await store.scan() == []
    assert kv.get(keys.lock("wal_0")) is None


def test_record_round_trips_through_json() -> None:
    rec = record(
        state=ProcedureState.RETRYING,
        error="x",
        error_code="unavailable",
        steps=(StepRun("prepare", 1.0, 3.5, 2, "boom"), StepRun("purge", 4.0)),
    )
    assert ProcedureRecord.from_json(rec.to_json()) == rec
    assert rec.timings() == {"prepare": 2.5}


@pytest.fixture
def pg_history(postgres_url: str) -> Iterator[History]:
    with fresh_schema(postgres_url) as url:
        migrations.upgrade(url)
        engine = create_engine(engine_url(url))
        try:
            yield History(engine)
        finally:
            engine.dispose()


async def test_history_on_postgresql(pg_history: History) -> None:
    now = time.time()
    rec = record(
        state=ProcedureState.SKIPPED,
        outcome="blocked by 7 (stale_stat)",
        finished_at=now,
        started_at=now - 1,
        steps=(StepRun("prepare", now - 1, now, 1, None),),
    )
    await pg_history.record_procedure(rec)
    await pg_history.record_procedure(rec)  # idempotent
    view = await pg_history.get_procedure(rec.id)
    assert view is not None
    assert (view.state, view.outcome, view.reason, view.topic) == (
        ProcedureState.SKIPPED,
        "blocked by 7 (stale_stat)",
        "test",
        "wal_0",
    )
    assert abs(view.submitted_at - rec.submitted_at) < 1e-3
    assert [v.id for v in await pg_history.list_procedures(state=ProcedureState.SKIPPED)] == [
        rec.id
    ]
    assert await pg_history.list_procedures(state=ProcedureState.FAILED) == []

    at = datetime.fromtimestamp(now, tz=UTC)
    purge = PurgeRecord(
        procedure_id=rec.id,
        topic="wal_0",
        prune_point=40,
        previous_pruned_entry_id=None,
        previous_log_start=0,
        low_watermark=40,
        entries_deleted=40,
        bytes_estimated=4000,
        logical_delete=False,
        duration_s=1.5,
        finished_at=at,
    )
    await pg_history.record_purge(purge)
    await pg_history.record_purge(purge)  # a resumed procedure writes once
    [row] = await pg_history.purges(topic="wal_0")
    assert (row.prune_point, row.entries_deleted, row.bytes_estimated) == (40, 40, 4000)
    assert abs((row.finished_at - at).total_seconds()) < 1e-3

    event = WalEvent(
        topic="wal_0", kind="wal_data_loss", region_id=2, details={"log_start": 30}, at=at
    )
    await pg_history.record_event(event)
    [event] = await pg_history.events(topic="wal_0", kind="wal_data_loss")
    assert (event.region_id, event.details) == (2, {"log_start": 30})


async def test_group_commit_merges_and_isolates_failures(kv: KvBackend) -> None:
    import asyncio

    from metasrv.kv import Put
    from procedures import GroupCommitter

    committer = GroupCommitter(kv, None, window=0.01)
    kv.put("taken", b"x")
    good = [committer.txn([Compare(f"k{i}", revision=0)], [Put(f"k{i}", b"v")]) for i in range(8)]
    bad = committer.txn([Compare("taken", revision=0)], [Put("taken", b"y")])
    # Same key twice: never merged into one transaction, and the second CAS loses.
    first = committer.txn([Compare("dup", revision=0)], [Put("dup", b"1")])
    second = committer.txn([Compare("dup", revision=0)], [Put("dup", b"2")])

    results = await asyncio.gather(*good, bad, first, second)

    assert [r.succeeded for r in results] == [True] * 8 + [False, True, False]
    assert committer.batches >= 1
    assert all(kv.get(f"k{i}") is not None for i in range(8))
    taken, dup = kv.get("taken"), kv.get("dup")
    assert taken is not None and taken.value == b"x"
    assert dup is not None and dup.value == b"1"
