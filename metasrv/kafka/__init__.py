"""Kafka adapter: the only package that talks to the broker's admin API, and the one place
`[wal.tls]` / `[wal.sasl]` become client settings.

- `_admin.py`: `KafkaAdmin`, topic creation, offsets, consumer groups' committed offsets and
  DeleteRecords, batched, with the client rebuilt on answers that show stale metadata.
- `_errors.py`: the one table that translates librdkafka's errors into metasrv's.
- `_topics.py`: legal and colliding topic names, and whether a partition has a live leader.
- `_client_config.py`: `[wal.tls]` / `[wal.sasl]` as librdkafka properties.
- `_durability.py`: each WAL topic's replication factor and min ISR against the settings.
"""

from metasrv.kafka._admin import KafkaAdmin
from metasrv.kafka._client_config import client_config
from metasrv.kafka._durability import DurabilityCache, below_configured
from metasrv.kafka._errors import translate_kafka_error
from metasrv.kafka._topics import collision_key, leader_problem, topic_name_problem

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
