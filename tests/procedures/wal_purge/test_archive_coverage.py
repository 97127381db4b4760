"""The purge's archive check (DESIGN §8, invariant 10) against real Kafka, etcd and the stack's
S3 server: with `[wal.archive] enabled` nothing is deleted from Kafka that the bucket does not
hold. A gap in [log start, target), or a store that does not answer, ends the purge skipped
(`not_archived`) with nothing deleted and the marker where it was; the plan views and the
leader's gauge say so until a check passes. A purge step resumed by a new leader checks
again, also when the marker is already at its target and the archive's group committed past
it: the group's word is not the bucket. Objects are written with `ObjectStore` directly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from metasrv import keys
from metasrv.archive import ObjectStore, WalRecord
from procedures import ProcedureRecord, ProcedureState, state_key
from procedures.wal_purge import (
    NOT_ARCHIVED,
    PurgeData,
    advance_marker,
    gather_plans,
    submit_purges,
)
from tests._archive import archive_config, archive_settings, put_archived
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory
from toolbox.stack import S3Endpoint


def records(first: int, last: int) -> list[WalRecord]:
    """Entries first..last as an archiver would have written them (the check reads keys)."""
    return [
        WalRecord(i, 1_700_000_000_000 + i, b"1", f"r-{i}".encode()) for i in range(first, last + 1)
    ]


def commit(h: Harness, group: str, topic: str, offset: int) -> None:
    """A member of `group` commits `offset` on partition 0 of `topic`."""
    consumer = Consumer(
        {"bootstrap.servers": h.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


async def purge(h: Harness, topic: str) -> tuple[ProcedureState, str]:
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)
    assert view.state.terminal, view
    return view.state, view.outcome or ""


@pytest.fixture
def store(s3_endpoint: S3Endpoint, s3_prefix: str) -> Iterator[ObjectStore]:
    client = ObjectStore(archive_settings(s3_endpoint, s3_prefix))
    yield client
    for obj in client.list(s3_prefix):
        client.delete(obj.key)
    client.close()


def archive_group(prefix: str) -> str:
    return f"{prefix}-archive"


async def archived_world(
    factory: HarnessFactory, s3: S3Endpoint, prefix: str, **archive: object
) -> tuple[Harness, str]:
    """One region on topic 0 flushed to 70 of 100 entries; the archive enabled, its group
    committed at 90 (the pin holds P at 70, past what the bucket must hold)."""
    config = archive_config(s3, prefix + "/", consumer_group=archive_group(prefix), **archive)
    h = await factory(wal={"archive": config})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report(1, topic, flushed=70)
    commit(h, archive_group(prefix), topic, 90)
    return h, topic


def blocked_gauge(h: Harness, topic: str) -> float | None:
    return h.metrics.registry.get_sample_value("metasrv_wal_archive_blocked", {"topic": topic})


async def test_a_gap_in_the_archive_blocks_the_purge_until_it_is_filled(
    harness_factory: HarnessFactory,
    s3_endpoint: S3Endpoint,
    unique_prefix: str,
    store: ObjectStore,
) -> None:
    h, topic = await archived_world(harness_factory, s3_endpoint, unique_prefix)
    put_archived(store, topic, records(0, 29))
    put_archived(store, topic, records(40, 89))
    marker_before = h.marker(topic)

    state, outcome = await purge(h, topic)

    assert state is ProcedureState.SKIPPED, outcome
    assert f"({NOT_ARCHIVED})" in outcome and "[30, 40) of [0, 70)" in outcome
    assert h.offsets(topic).log_start_offset == 0
    assert h.marker(topic) == marker_before
    assert blocked_gauge(h, topic) == 1
    # The plan names why, without asking the store; its prune point stays for the next try.
    [inputs] = (await gather_plans(h.services, [topic])).values()
    assert inputs.plan.prune_point == 70
    assert inputs.plan.not_archived is not None and "[30, 40)" in inputs.plan.not_archived

    put_archived(store, topic, records(25, 45))  # an overlapping object fills the gap
    state, outcome = await purge(h, topic)

    assert state is ProcedureState.SUCCEEDED, outcome
    assert h.offsets(topic).log_start_offset == 70 and h.marker(topic) == 70
    assert blocked_gauge(h, topic) == 0
    [inputs] = (await gather_plans(h.services, [topic])).values()
    assert inputs.plan.not_archived is None


async def test_a_store_that_does_not_answer_blocks_the_purge(
    harness_factory: HarnessFactory, s3_endpoint: S3Endpoint, unique_prefix: str
) -> None:
    # Nothing listens on port 9 (discard) of the loopback: connections are refused.
    h, topic = await archived_world(
        harness_factory, s3_endpoint, unique_prefix, endpoint="http://127.0.0.1:9"
    )

    state, outcome = await purge(h, topic)

    assert state is ProcedureState.SKIPPED, outcome
    assert f"({NOT_ARCHIVED}): its store did not answer" in outcome
    assert h.offsets(topic).log_start_offset == 0
    assert blocked_gauge(h, topic) == 1


async def test_a_resumed_catch_up_checks_the_bucket_not_the_group(
    harness_factory: HarnessFactory,
    s3_endpoint: S3Endpoint,
    unique_prefix: str,
    store: ObjectStore,
) -> None:
    """A leader moved the marker to 70 and died before DeleteRecords; the archive's group
    committed 90, yet the bucket holds only [0, 40]. The new leader's resumed purge step
    would only catch Kafka up to the marker, which needs no stats: it checks the bucket all
    the same and deletes nothing (the fault suite's "Kafka deleted below 5699, the archive
    lacks entries (0, 611)"). Once the bucket holds it, the next purge catches up."""
    old = await harness_factory()
    topic = old.topic(0)
    await old.register(1, topic)
    old.produce(topic, 100)
    topic_id = old.offsets(topic).topic_id
    await advance_marker(old.services, topic, 70, topic_id=topic_id)
    pid = uuid.uuid4().hex
    data = PurgeData(topic, prune_point=70, previous_pruned_entry_id=None, log_start_offset=0,
                     high_watermark=100, topic_id=topic_id, target=70)  # fmt: skip
    record = ProcedureRecord(
        id=pid,
        kind="wal_purge",
        topic=topic,
        state=ProcedureState.RUNNING,
        step="purge",
        attempts=0,
        reason="test",
        data=data.to_json(),
        submitted_at=time.time() - 5,
        started_at=time.time() - 5,
        kv_locks=(keys.lock(topic),),
    )
    old.kv.put(state_key(pid), record.to_json())
    old.kv.put(keys.lock(topic), orjson.dumps({"procedure_id": pid}))  # as the store writes it
    await old.close()
    group = archive_group(unique_prefix)
    commit(old, group, topic, 90)
    put_archived(store, topic, records(0, 40))

    config = archive_config(s3_endpoint, unique_prefix + "/", consumer_group=group)
    new = await harness_factory(wal={"archive": config})
    view = await new.manager.wait(pid, 30)

    assert view.state is ProcedureState.SKIPPED, view
    assert view.outcome is not None and "[41, 70) of [0, 70)" in view.outcome
    assert new.offsets(topic).log_start_offset == 0
    assert new.marker(topic) == 70  # never moves back

    put_archived(store, topic, records(41, 69))
    new.report(1, topic, flushed=70)
    state, outcome = await purge(new, topic)

    assert state is ProcedureState.SUCCEEDED, outcome
    assert new.offsets(topic).log_start_offset == 70
