"""What Kafka's topic names and metadata say: which names Kafka accepts, which collide, and
whether a topic's partitions have a live leader to read from."""

from __future__ import annotations

import re

from confluent_kafka import KafkaError
from confluent_kafka.admin._metadata import ClusterMetadata

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def collision_key(topic: str) -> str:
    """Kafka refuses a topic whose name equals an existing one's with '.' read as '_'."""
    return topic.replace(".", "_")


def topic_name_problem(topic: str) -> str | None:
    """Why Kafka would refuse `topic` as a name, or None when it is legal."""
    if not _TOPIC_NAME.match(topic):
        return "a Kafka topic name is 1 to 249 characters of [A-Za-z0-9._-]"
    if topic in (".", ".."):
        return "Kafka does not allow '.' or '..' as a topic name"
    return None


def leader_problem(md: ClusterMetadata, topic: str) -> str | None:
    """Why `topic`'s partitions cannot be read per `md` (a topic error, a partition without
    a leader or led by a broker the cluster no longer lists), or None."""
    meta = md.topics[topic]
    if meta.error is not None:
        return f"topic error {meta.error.name()}"
    if not meta.partitions:
        return "no partitions in metadata"
    for pid, part in sorted(meta.partitions.items()):
        # REPLICA_NOT_AVAILABLE (a follower down) leaves the partition readable.
        if part.error is not None and part.error.code() == KafkaError.LEADER_NOT_AVAILABLE:
            return f"partition {pid}: {part.error.name()}"
        if part.leader < 0:
            return f"partition {pid} has no leader"
        if part.leader not in md.brokers:
            return f"partition {pid}'s leader {part.leader} is not a live broker"
    return None
