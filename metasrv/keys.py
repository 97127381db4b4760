"""The kv key layout of DESIGN §4, in one place. Values are JSON."""

from __future__ import annotations

TOPIC_NAME_PREFIX = "__topic_name/kafka/"
TOPIC_REGION_PREFIX = "__topic_region/"
PROCEDURE_PREFIX = "__procedure__/"
ELECTION_KEY = "__metasrv_election"
LOCK_PREFIX = "__remote_wal_lock/"


def topic_name(topic: str) -> str:
    """`__topic_name/kafka/{topic}` -> {"pruned_entry_id": int|null}"""
    return f"{TOPIC_NAME_PREFIX}{topic}"


def topic_region(topic: str, region_id: int) -> str:
    """`__topic_region/{topic}/{region_id}` -> {"node_id": int, "checkpoint": {...}|null}"""
    return f"{TOPIC_REGION_PREFIX}{topic}/{region_id}"


def topic_region_prefix(topic: str) -> str:
    """Prefix of every region mapped to `topic`."""
    return f"{TOPIC_REGION_PREFIX}{topic}/"


def parse_topic_region(key: str) -> tuple[str, int]:
    """Inverse of `topic_region`: (topic, region_id)."""
    rest = key[len(TOPIC_REGION_PREFIX) :]
    topic, _, region = rest.rpartition("/")
    return topic, int(region)


def procedure_prefix(procedure_id: str) -> str:
    """Prefix of every key of one procedure."""
    return f"{PROCEDURE_PREFIX}{procedure_id}/"


def lock(topic: str) -> str:
    """`__remote_wal_lock/{topic}`"""
    return f"{LOCK_PREFIX}{topic}"
