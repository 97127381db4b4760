"""The WAL archive (DESIGN §8): WAL ranges copied to an S3-compatible object store.

In the order a decision flows:
- `_objects`: what the bucket's keys mean. `ArchivedRange` and its key codec
  (`{prefix}{topic}/{first:020d}-{last:020d}.parquet`), and `covering`: the shortest chain
  of (possibly overlapping) objects that holds [start, end), or the first gap. Pure.
- `_store`: `ObjectStore`, the boto3 adapter (put with checksums, verified get, paginated
  list, delete), its errors translated once into `metasrv.errors`.
"""

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
    "SHA256_METADATA",
    "ArchivedRange",
    "Coverage",
    "ObjectStore",
    "StoredObject",
    "covering",
    "parse_object_key",
    "topic_prefix",
]
