"""Kafka adapter: the only module that talks to the broker's admin API."""

from metasrv.kafka._admin import (
    KafkaAdmin,
    collision_key,
    topic_name_problem,
    translate_kafka_error,
)

__all__ = ["KafkaAdmin", "collision_key", "topic_name_problem", "translate_kafka_error"]
