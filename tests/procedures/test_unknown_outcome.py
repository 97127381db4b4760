"""A procedure create whose outcome is unknown (the kv answer lost, or the write failed)
is settled by reading the record back, on the real etcd and PostgreSQL kv backends: a
landed create is done and its procedure runs; one that did not land is tried again.

The faults come from `FaultyKv` around the real backend: it performs the transaction and
then raises `KvUnavailable`, or raises before the store sees it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest

import migrations
from metasrv import keys
from metasrv.kv import Compare, EtcdKv, KvBackend, SqlKv, TxnOp
from procedures import ProcedureRecord, ProcedureState, ProcedureStore
from procedures.wal_purge import submit_purges
from tests._metrics import sample
from tests.metasrv.kv._pgschema import fresh_schema
from tests.procedures._faulty_kv import (
    BACKENDS,
    FaultyKv,
    LeaderFactory,
    creates_procedure,
    harnesses_on,
    saves_procedure,
    written_records,
)


@pytest.fixture(params=BACKENDS)
def real_kv(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[KvBackend]:
    backend: KvBackend
    if request.param == "etcd":
        backend = EtcdKv([request.getfixturevalue("etcd_endpoint")], f"{unique_prefix}/")
        try:
            yield backend
        finally:
            backend.delete_prefix("")
            backend.close()
        return
    with fresh_schema(request.getfixturevalue("postgres_url")) as url:
        migrations.upgrade(url)
        backend = SqlKv(url, "")
        try:
            yield backend
        finally:
            backend.close()


@pytest.fixture(params=BACKENDS)
async def leaders(
    request: pytest.FixtureRequest, kafka_bootstrap: str, unique_prefix: str, history_url: str
) -> AsyncIterator[LeaderFactory]:
    async with harnesses_on(
        request.param, request, kafka=kafka_bootstrap, prefix=unique_prefix, history_url=history_url
    ) as factory:
        yield factory


def purge_record(topic: str) -> ProcedureRecord:
    return ProcedureRecord(
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


def fenced_store(kv: KvBackend) -> ProcedureStore:
    kv.put(keys.ELECTION_KEY, b"me")
    return ProcedureStore(kv, lambda: [Compare(keys.ELECTION_KEY, value=b"me")])


async def test_a_create_whose_answer_was_lost_is_read_back_as_created(real_kv: KvBackend) -> None:
    faulty = FaultyKv(real_kv)
    store = fenced_store(faulty.as_backend())
    record = purge_record("wal_0")
    faulty.lose_answer(creates_procedure)

    made = await store.create(record)

    assert len(faulty.landed) == 1 and faulty.landed[0][2].succeeded  # it did land
    stored = await store.load(record.id)
    assert stored is not None and stored.record == record
    assert (made.created, made.procedure_id, made.revision) == (True, record.id, stored.revision)
    assert await store.lock_holder(keys.lock("wal_0")) == record.id
    # The revision it returned is the CAS token of the stored record.
    running = await store.save(stored.record, made.revision)
    assert running > made.revision


async def test_a_create_that_did_not_land_is_tried_again(real_kv: KvBackend) -> None:
    faulty = FaultyKv(real_kv)
    store = fenced_store(faulty.as_backend())
    record = purge_record("wal_1")
    faulty.fail(creates_procedure, times=2)

    made = await store.create(record)

    assert faulty.hits == 2 and faulty.landed == []
    assert made.created and made.procedure_id == record.id
    assert await store.lock_holder(keys.lock("wal_1")) == record.id


async def test_a_lost_create_answer_on_another_topic_holder_still_names_the_holder(
    real_kv: KvBackend,
) -> None:
    # The lock is held by another procedure: the write never landed (its compare failed),
    # and the create names the holder as without the fault.
    faulty = FaultyKv(real_kv)
    store = fenced_store(faulty.as_backend())
    first = purge_record("wal_2")
    assert (await store.create(first)).created
    faulty.lose_answer(creates_procedure)

    again = await store.create(purge_record("wal_2"))

    assert not again.created and again.procedure_id == first.id
    assert [s.record.id for s in await store.scan()] == [first.id]


async def test_a_submit_whose_create_answer_was_lost_runs_the_purge(
    leaders: LeaderFactory,
) -> None:
    faulty: list[FaultyKv] = []

    def wrap(kv: KvBackend) -> KvBackend:
        faulty.append(FaultyKv(kv))
        return faulty[0].as_backend()

    h = await leaders(wrap=wrap)
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 20)
    h.report(1, topic, flushed=12)
    faulty[0].lose_answer(creates_procedure)

    [pid] = await submit_purges(h.manager, [topic], reason="test")

    assert len(faulty[0].landed) == 1
    view = await h.manager.wait(pid, 30)
    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.marker(topic) == 12
    assert h.offsets(topic).log_start_offset == 12
    assert h.kv.get(keys.lock(topic)) is None


def ends_procedure(compares: Sequence[Compare], ops: Sequence[TxnOp]) -> bool:
    """The terminal write of a procedure record."""
    return saves_procedure(compares, ops) and any(r.state.terminal for r in written_records(ops))


async def test_a_terminal_write_whose_answer_was_lost_ends_the_purge_once(
    leaders: LeaderFactory,
) -> None:
    # The run restarts from the stored record, finds it terminal, and ends as the write's
    # answer would have: the end's event, metric and history row, once.
    faulty: list[FaultyKv] = []

    def wrap(kv: KvBackend) -> KvBackend:
        faulty.append(FaultyKv(kv))
        return faulty[0].as_backend()

    h = await leaders(wrap=wrap)
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 20)
    h.report(1, topic, flushed=12)
    faulty[0].lose_answer(ends_procedure)

    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)

    assert len(faulty[0].landed) == 1
    assert view.state is ProcedureState.SUCCEEDED, view
    assert h.marker(topic) == 12 and h.kv.get(keys.lock(topic)) is None
    ended = await h.manager.services.events.read(topic=topic, kinds=["purge_deleted"])
    assert [e.procedure_id for e in ended] == [pid]
    succeeded = {"kind": "wal_purge", "state": "succeeded"}
    assert sample(h.metrics, "metasrv_procedure_duration_seconds_count", succeeded) == 1
    assert await h.manager.services.history.get_procedure(pid) is not None
