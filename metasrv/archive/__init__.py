"""The WAL archive (DESIGN §8): WAL ranges copied to an S3-compatible object store.

In the order a decision flows:
- `_objects`: what the bucket's keys mean. `ArchivedRange` and its key codec
  (`{prefix}{topic}/{first:020d}-{last:020d}.parquet`), and `covering`: the shortest chain
  of (possibly overlapping) objects that holds [start, end), or the first gap. Pure.
- `_store`: `ObjectStore`, the boto3 adapter (put with checksums, verified get, paginated
  list, delete), its errors translated once into `metasrv.errors`.
- `_archiver`: `Archiver`, one member of the archive's consumer group: buffers each WAL
  topic's records, writes one Parquet object per range, reads it back and verifies it, and
  only then commits the range's end; its metrics and the object's encoding beside it.
"""

from metasrv.archive._archiver import (
    OBJECT_SCHEMA,
    SESSION_TIMEOUT_MS,
    Archiver,
    ArchiverMetrics,
    PausePoint,
    WalRecord,
    decode_object,
    encode_object,
    pool_topics,
    verify_object,
)
from metasrv.archive._objects import (
    MAX_ENTRY_ID,
    ArchivedRange,
    Coverage,
    covering,
    parse_object_key,
    topic_prefix,
)
from metasrv.archive._store import SHA256_METADATA, ObjectStore, StoredObject

__all__ = [
    "MAX_ENTRY_ID",
    "OBJECT_SCHEMA",
    "SESSION_TIMEOUT_MS",
    "SHA256_METADATA",
    "ArchivedRange",
    "Archiver",
    "ArchiverMetrics",
    "Coverage",
    "ObjectStore",
    "PausePoint",
    "StoredObject",
    "WalRecord",
    "covering",
    "decode_object",
    "encode_object",
    "parse_object_key",
    "pool_topics",
    "topic_prefix",
    "verify_object",
]
