"""Kafka adapter: the only module that talks to the broker's admin API."""

from metasrv.kafka._admin import KafkaAdmin, translate_kafka_error

__all__ = ["KafkaAdmin", "translate_kafka_error"]
