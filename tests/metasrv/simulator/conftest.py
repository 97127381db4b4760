"""Fixtures for the simulator tests: a fresh Kafka topic per test on the real broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metasrv.kafka import KafkaAdmin


@pytest.fixture
def admin(kafka_bootstrap: str) -> Iterator[KafkaAdmin]:
    """An admin client of the test broker."""
    client = KafkaAdmin(kafka_bootstrap)
    yield client
    client.close()


@pytest.fixture
def topic(admin: KafkaAdmin, unique_prefix: str) -> Iterator[str]:
    """A new single-partition topic, deleted after the test."""
    name = f"{unique_prefix}_0"
    admin.ensure_topics([name])
    yield name
    admin.delete_topics([name])
