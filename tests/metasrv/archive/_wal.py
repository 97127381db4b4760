"""What the archiver tests share: a WAL pool of real topics, records produced to it, the group's
committed offsets, and what the bucket holds for a topic (checked for gaps and read back)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from metasrv.archive import (
    ArchivedRange,
    ObjectStore,
    WalRecord,
    covering,
    decode_object,
    parse_object_key,
    topic_prefix,
)
from metasrv.kafka import KafkaAdmin
from metasrv.settings import WalSettings
from toolbox.simulator import render_config
from toolbox.stack import S3Endpoint


@dataclass(frozen=True)
class Pool:
    """A test's WAL pool: topics `{prefix}_{n}`, the archive group, the bucket prefix."""

    bootstrap: str
    prefix: str
    topics: list[str]
    group: str
    s3: S3Endpoint
    s3_prefix: str

    def sections(self, **archive: Any) -> dict[str, dict[str, Any]]:
        """`[wal]` and `[wal.archive]` of an archiver of this pool (`archive` overrides)."""
        return {
            "wal": {
                "broker_endpoints": [self.bootstrap],
                "topic_name_prefix": self.prefix,
                "num_topics": len(self.topics),
            },
            "wal.archive": {
                "enabled": True,
                "endpoint": self.s3.endpoint,
                "bucket": self.s3.bucket,
                "prefix": self.s3_prefix,
                "access_key_id": self.s3.access_key_id,
                "secret_access_key": self.s3.secret_access_key,
                "consumer_group": self.group,
                "object_max_bytes": "4KB",
                "object_max_delay": "200ms",
                **archive,
            },
        }

    def wal_settings(self, **archive: Any) -> WalSettings:
        sections = self.sections(**archive)
        return WalSettings.model_validate({**sections["wal"], "archive": sections["wal.archive"]})

    def write_config(self, path: Path, http_addr: str, **archive: Any) -> Path:
        sections = {**self.sections(**archive), "http": {"addr": http_addr}}
        path.write_text(render_config(sections))
        return path


def produce(bootstrap: str, topic: str, count: int, *, start: int = 0) -> list[WalRecord]:
    """`count` records to partition 0 of `topic` (some with no key, some with headers), as the
    archive should hold them (offsets and timestamps as the broker stored them)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    stored: list[WalRecord] = []
    failures: list[str] = []

    def delivered(headers: tuple[tuple[str, bytes], ...], err: Any, msg: Any) -> None:
        # A delivery report carries no headers: the test knows the ones it sent.
        if err is not None:
            failures.append(str(err))
            return
        stored.append(WalRecord(msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), headers))

    for n in range(start, start + count):
        headers = (("h", f"{n}".encode()),) if n % 2 else ()
        producer.produce(
            topic,
            partition=0,
            key=None if n % 3 == 0 else f"region-{n % 2}".encode(),
            value=f"entry {n} of {topic} ".encode() * 8,
            headers=list(headers) or None,
            on_delivery=functools.partial(delivered, headers),
        )
    if producer.flush(30) or failures:
        raise KafkaException(f"produce to {topic} failed: {failures}")
    return sorted(stored, key=lambda r: r.entry_id)


def committed(admin: KafkaAdmin, group: str, topics: list[str]) -> dict[str, int | None]:
    """The group's committed offset on partition 0 of each topic (None: none)."""
    answers = admin.committed_offsets([group], topics)
    found: dict[str, int | None] = {}
    for topic, answer in answers.items():
        if isinstance(answer, Exception):
            raise answer
        found[topic] = answer.get(group)
    return found


def ranges(store: ObjectStore, topic: str) -> list[ArchivedRange]:
    """Every archived range of `topic` under the store's prefix."""
    return [
        parse_object_key(store.prefix, o.key) for o in store.list(topic_prefix(store.prefix, topic))
    ]


def archived_entries(store: ObjectStore, topic: str, end: int) -> list[WalRecord]:
    """Entries [0, end) of `topic` read back from the bucket; fails on a gap or on two objects
    that disagree about an entry."""
    found = ranges(store, topic)
    coverage = covering(found, 0, end)
    assert coverage.covered, f"{topic}: no object holds entries {coverage.gap} (have {found})"
    entries: dict[int, WalRecord] = {}
    for rng in found:
        for record in decode_object(store.get(rng.key(store.prefix))):
            assert entries.setdefault(record.entry_id, record) == record, "overlaps disagree"
    return [entries[i] for i in sorted(entries) if i < end]
