"""The WAL archive's retention on the leader (DESIGN §8) against real Kafka, etcd and the
stack's S3 server: objects wholly below min(marker + 1, Kafka's log start) and older than
`[wal.archive] retention` are deleted; one a purge's coverage check may still need (from
Kafka's log start on), a young one, and keys that name no archived object are kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from metasrv.archive import ObjectStore, WalRecord
from procedures.wal_purge import ArchiveRetention, advance_marker
from tests._archive import archive_config, archive_settings, put_archived, trim
from tests._wait import eventually
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory
from toolbox.stack import S3Endpoint


def records(first: int, last: int) -> list[WalRecord]:
    return [WalRecord(i, 1_700_000_000_000 + i, b"1", b"v") for i in range(first, last + 1)]


@pytest.fixture
def store(s3_endpoint: S3Endpoint, s3_prefix: str) -> Iterator[ObjectStore]:
    client = ObjectStore(archive_settings(s3_endpoint, s3_prefix))
    yield client
    for obj in client.list(s3_prefix):
        client.delete(obj.key)
    client.close()


async def purged_world(
    factory: HarnessFactory, s3: S3Endpoint, prefix: str, store: ObjectStore, retention: str
) -> tuple[Harness, str, dict[str, str]]:
    """Topic 0 purged to 60 (the marker) while Kafka's log start is 50 (its deletion
    pending): the floor is 50. Objects [0, 19], [20, 49], [40, 60], [61, 80] and a key that
    names no object; returns them by name."""
    archive = archive_config(
        s3, prefix + "/", consumer_group=f"{prefix}-archive", retention=retention
    )
    h = await factory(wal={"archive": archive})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    assert trim(h.bootstrap, topic, 50) == 50
    await advance_marker(h.services, topic, 60, topic_id=h.offsets(topic).topic_id)
    keys = {
        "0-19": put_archived(store, topic, records(0, 19)),
        "20-49": put_archived(store, topic, records(20, 49)),
        "40-60": put_archived(store, topic, records(40, 60)),
        "61-80": put_archived(store, topic, records(61, 80)),
    }
    keys["notes"] = f"{prefix}/{topic}/notes.txt"
    store.put(keys["notes"], b"not an archived object")
    return h, topic, keys


async def test_objects_below_the_floor_and_past_the_retention_are_deleted(
    harness_factory: HarnessFactory,
    s3_endpoint: S3Endpoint,
    unique_prefix: str,
    store: ObjectStore,
) -> None:
    h, topic, keys = await purged_world(harness_factory, s3_endpoint, unique_prefix, store, "1s")
    retention = ArchiveRetention(h.services, leading=lambda: True)
    assert retention.enabled
    kept = {keys["40-60"], keys["61-80"], keys["notes"]}

    async def trimmed() -> bool:
        await retention.trim_once()
        return {o.key for o in store.list(f"{unique_prefix}/{topic}/")} == kept

    await eventually(trimmed, "objects below 50 older than 1s deleted")
    assert not await ArchiveRetention(h.services, leading=lambda: False).trim_once()


async def test_young_objects_stay_and_0s_keeps_every_object(
    harness_factory: HarnessFactory,
    s3_endpoint: S3Endpoint,
    unique_prefix: str,
    store: ObjectStore,
) -> None:
    h, topic, keys = await purged_world(harness_factory, s3_endpoint, unique_prefix, store, "1h")

    assert await ArchiveRetention(h.services, leading=lambda: True).trim_once() == 0
    assert {o.key for o in store.list(f"{unique_prefix}/{topic}/")} == set(keys.values())

    wal = h.settings.wal
    archive = wal.archive.model_copy(update={"retention": 0.0})
    settings = h.settings.model_copy(update={"wal": wal.model_copy(update={"archive": archive})})
    forever = ArchiveRetention(replace(h.services, settings=settings), leading=lambda: True)
    assert not forever.enabled and await forever.trim_once() == 0
