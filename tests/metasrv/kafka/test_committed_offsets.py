"""Consumer groups' committed offsets as the Kafka adapter reads them (`committed_offsets`),
against the real broker: each group's offset on partition 0 of each topic, None where it
committed none, and Kafka being unreachable as the retryable error every read raises."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from metasrv.errors import KafkaUnavailable
from metasrv.kafka import KafkaAdmin
from tests._archive import commit_offset


@pytest.fixture
def topics(kafka_admin: KafkaAdmin, unique_prefix: str) -> Iterator[list[str]]:
    names = [f"{unique_prefix}_wal_{n}" for n in range(3)]
    kafka_admin.ensure_topics(names)
    yield names
    kafka_admin.delete_topics(names)


def test_each_groups_offset_on_each_topic_none_where_it_committed_none(
    kafka_admin: KafkaAdmin, kafka_bootstrap: str, topics: list[str], unique_prefix: str
) -> None:
    cdc, standby, idle = (f"{unique_prefix}-{name}" for name in ("cdc", "standby", "idle"))
    commit_offset(kafka_bootstrap, cdc, topics[0], 0)
    commit_offset(kafka_bootstrap, cdc, topics[1], 7)
    commit_offset(kafka_bootstrap, standby, topics[1], 3)

    found = kafka_admin.committed_offsets([cdc, standby, idle], topics)

    assert found == {
        topics[0]: {cdc: 0, standby: None, idle: None},
        topics[1]: {cdc: 7, standby: 3, idle: None},
        topics[2]: {cdc: None, standby: None, idle: None},
    }
    # The offset moves as the group commits.
    commit_offset(kafka_bootstrap, cdc, topics[1], 9)
    assert kafka_admin.committed_offsets([cdc], [topics[1]]) == {topics[1]: {cdc: 9}}


def test_no_group_or_no_topic_asks_nothing(kafka_admin: KafkaAdmin, topics: list[str]) -> None:
    assert kafka_admin.committed_offsets([], topics) == {t: {} for t in topics}
    assert kafka_admin.committed_offsets(["g"], []) == {}


def test_kafka_unreachable_fails_every_topic_as_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # a port nobody listens on
        port = sock.getsockname()[1]
    admin = KafkaAdmin(f"127.0.0.1:{port}", request_timeout=1.0)
    try:
        found = admin.committed_offsets(["cdc", "standby"], ["wal_0", "wal_1"], timeout=1.0)
    finally:
        admin.close()
    assert set(found) == {"wal_0", "wal_1"}
    for answer in found.values():
        assert isinstance(answer, KafkaUnavailable), answer
        assert answer.retryable
