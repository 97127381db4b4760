"""Kafka adapter: the only module that talks to the broker's admin API, and the one
place `[wal.tls]` / `[wal.sasl]` become client settings."""

from metasrv.kafka._admin import (
    KafkaAdmin,
    collision_key,
    leader_problem,
    topic_name_problem,
    translate_kafka_error,
)
from metasrv.kafka._client_config import client_config
from metasrv.kafka._durability import DurabilityCache, below_configured

__all__ = [
    "DurabilityCache",
    "KafkaAdmin",
    "below_configured",
    "client_config",
    "collision_key",
    "leader_problem",
    "topic_name_problem",
    "translate_kafka_error",
]
