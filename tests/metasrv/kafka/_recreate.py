"""Delete a Kafka topic and create it again under the same name, as an operator, a
clean-up script or a broker's auto-create would: the topic a WAL's offsets belonged to is
gone, and a new one starts again at offset 0 with a new topic id."""

from __future__ import annotations

from metasrv.errors import MetasrvError
from metasrv.kafka import KafkaAdmin
from tests._wait import wait_until


def topic_id(admin: KafkaAdmin, topic: str) -> str:
    """Kafka's current id of `topic` (read with its offsets)."""
    found = admin.offsets([topic])[topic].topic_id
    assert found is not None, f"Kafka gave no topic id for {topic}"
    return found


def delete_topic(admin: KafkaAdmin, topic: str, *, timeout: float = 60.0) -> None:
    """Delete `topic` and wait until Kafka's metadata no longer lists it."""
    admin.delete_topics([topic])
    wait_until(
        lambda: topic not in admin.list_topics(),
        f"{topic} no longer listed after its deletion",
        timeout=timeout,
        interval=0.1,
    )


def create_topic(admin: KafkaAdmin, topic: str, *, timeout: float = 60.0) -> str | None:
    """Create `topic` (retrying while Kafka still finishes deleting an older one of that
    name) and wait until its offsets are readable; returns its topic id as read with them."""
    wait_until(
        lambda: admin.ensure_topics([topic]) == [topic],
        f"{topic} created",
        timeout=timeout,
        interval=0.2,
        ignore=(MetasrvError,),
    )
    offsets = wait_until(
        lambda: admin.offsets([topic])[topic],
        f"{topic}'s offsets readable",
        timeout=timeout,
        interval=0.1,
        ignore=(MetasrvError,),
    )
    return offsets.topic_id


def recreate_topic(
    admin: KafkaAdmin, topic: str, *, timeout: float = 60.0
) -> tuple[str | None, str | None]:
    """Delete `topic` and create it again; returns (old id, new id) as read with offsets."""
    old = admin.offsets([topic])[topic].topic_id
    delete_topic(admin, topic, timeout=timeout)
    return old, create_topic(admin, topic, timeout=timeout)
