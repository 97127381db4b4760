"""A datanode's side of metasrv: the client a database embeds (docs/protocol.md).

In the order a heartbeat flows:

- `_body.py`: the heartbeat body in either DESIGN §5 encoding (JSON, or msgpack columns
  written with the standard library only).
- `_route.py`: which metasrv gets a request: the current leader, a 421's named leader at
  once, the next address after a failure; a 503 (a new leader loading) is retried there.
- `_client.py`: `DatanodeClient` (blocking) and `AsyncDatanodeClient`: `heartbeat` and
  `replay_start` (or the whole `replay_answer`) against whichever metasrv leads;
  `replay_from`, the replay rule (never below the region's own flushed entry id + 1).
- `_replay.py`: `replay_region`, a region's WAL entries from its replay start: the WAL
  archive's objects metasrv names (DESIGN §8), then Kafka.
- `_loop.py`: `HeartbeatLoop` (a thread) and `AsyncHeartbeatLoop`: report, send, hand new
  flush instructions to the database's `on_flush`, retry after a backoff.

It imports only `metasrv.wire`, `metasrv.errors`, `metasrv.process` (`Backoff`: capped
exponential backoff between failed tries, full jitter below the cap), the standard library
and httpx; the replay also `metasrv.kafka` (its error table) and confluent-kafka, and
`metasrv.archive` (the object store, pyarrow) only when it reads the archive.
"""

from metasrv.datanode._body import (
    CONTENT_TYPES,
    Body,
    Encoding,
    as_heartbeat,
    encode_columns,
    encode_heartbeat,
)
from metasrv.datanode._client import (
    HEARTBEAT_PATH,
    REPLAY_START_PATH,
    AsyncDatanodeClient,
    DatanodeClient,
    replay_from,
)
from metasrv.datanode._loop import (
    AsyncHeartbeatLoop,
    FlushCallback,
    FlushInstructions,
    HeartbeatLoop,
)
from metasrv.datanode._replay import KafkaConfig, WalEntry, replay_entries, replay_region
from metasrv.datanode._route import Attempt, Route
from metasrv.process import Backoff
from metasrv.wire import Heartbeat, HeartbeatResponse, Instruction, RegionReport, TopicReport

__all__ = [
    "CONTENT_TYPES",
    "HEARTBEAT_PATH",
    "REPLAY_START_PATH",
    "AsyncDatanodeClient",
    "AsyncHeartbeatLoop",
    "Attempt",
    "Backoff",
    "Body",
    "DatanodeClient",
    "Encoding",
    "FlushCallback",
    "FlushInstructions",
    "Heartbeat",
    "HeartbeatLoop",
    "HeartbeatResponse",
    "Instruction",
    "KafkaConfig",
    "RegionReport",
    "Route",
    "TopicReport",
    "WalEntry",
    "as_heartbeat",
    "encode_columns",
    "encode_heartbeat",
    "replay_entries",
    "replay_from",
    "replay_region",
]
