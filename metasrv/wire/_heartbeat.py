"""The heartbeat body on the wire (DESIGN §5 `POST /v1/heartbeat`), in its two encodings.

- **JSON** (`application/json`, the DESIGN §5 contract): one object per region.
- **Columns** (`application/msgpack`): the same content with each region field as one
  column of little-endian int64s in a msgpack `bin` (one value per region, in the same
  order in every column), and each region's topic as an index into `topic_names`, so the
  leader compares and copies whole columns instead of visiting each region in Python:

      {"node_id": int, "addr": str | nil, "topic_names": [str],
       "regions": {"topic": bin, "region_id": bin, "flushed_entry_id": bin,
                   "memtable_bytes": bin, "topic_latest_entry_id": bin | nil,
                   "manifest_version": bin | nil},
       "topics": [{"topic": str, "latest_entry_id": int, "record_size": int,
                   "record_num": int}] | nil}

  A null `topic_latest_entry_id` or `manifest_version` of one region is `NULL` (-2**63)
  in its column; a column left out (nil) is null for every region. The answer is the
  same JSON as for a JSON heartbeat.

One range for every id and counter, `metasrv.model.ID_MAX` (2**63-1) as at every other
entry point; entry ids may also be -1 ("nothing"). Values outside int64 and wrong types
make the whole body a 422 naming the field; negative region ids and entry ids below -1
are per-region rejections (`negative_id`, see metasrv/leader/_judge.py). msgspec decodes and
checks a body in one pass in C into structs the garbage collector does not track.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Annotated, Any, Final, Literal

import msgspec
import numpy as np

from metasrv.model import NULL
from metasrv.wire._codec import invalid, refusal
from metasrv.wire._types import EntryId, Id, Int64, RejectReason

COLUMNS_FORMAT: Final = (
    "The heartbeat of DESIGN §5 as msgpack columns: {node_id, addr, topic_names: [str], "
    "regions: {topic, region_id, flushed_entry_id, memtable_bytes, topic_latest_entry_id?, "
    "manifest_version?}, topics?}; each regions field is a bin of little-endian int64s, one "
    "per region (topic: an index into topic_names); a null is -2**63, an absent column is "
    "null for every region. The response is the same JSON."
)
"""The columns encoding in one paragraph (the OpenAPI description of the msgpack body)."""
# NULL (-2**63) is a null in an int64 column of the columns encoding (`metasrv.model`).
MAX_REGIONS: Final = 100_000
"""Regions one heartbeat may report (a datanode hosts ~1,000 at the design load)."""
MAX_TOPIC_REPORTS: Final = 100_000
"""Topic reports one heartbeat may carry (at most one per pool topic: `num_topics`)."""

Topic = Annotated[str, msgspec.Meta(min_length=1)]


class RegionReport(msgspec.Struct, gc=False):
    """One `regions[]` entry of a JSON heartbeat; unknown fields are ignored."""

    region_id: Int64
    topic: str
    flushed_entry_id: Int64
    memtable_bytes: Id
    topic_latest_entry_id: Int64 | None = None
    manifest_version: Id | None = None


class TopicReport(msgspec.Struct, gc=False):
    """One `topics[]` entry (both encodings)."""

    topic: Topic
    latest_entry_id: EntryId
    record_size: Id
    record_num: Id


class Heartbeat(msgspec.Struct, gc=False):
    """A JSON heartbeat (DESIGN §5)."""

    node_id: Id
    regions: Annotated[list[RegionReport], msgspec.Meta(max_length=MAX_REGIONS)]
    addr: str | None = None
    topics: Annotated[list[TopicReport], msgspec.Meta(max_length=MAX_TOPIC_REPORTS)] | None = None


class Instruction(msgspec.Struct, kw_only=True):
    """An instruction for the datanode; repeated until applied or expired."""

    id: str
    kind: Literal["flush_regions"]
    region_ids: list[int]


class Rejection(msgspec.Struct, kw_only=True):
    """A region whose stat was not stored, and why."""

    region_id: int
    reason: RejectReason


class HeartbeatResponse(msgspec.Struct, kw_only=True):
    """`POST /v1/heartbeat` answer (the handler writes it directly; see
    metasrv/leader/_heartbeat.py)."""

    leader: str | None
    instructions: list[Instruction]
    rejected: list[Rejection]


class RegionColumns(msgspec.Struct, gc=False):
    """The `regions` of a columns heartbeat: int64 little-endian columns."""

    topic: bytes
    region_id: bytes
    flushed_entry_id: bytes
    memtable_bytes: bytes
    topic_latest_entry_id: bytes | None = None
    manifest_version: bytes | None = None


class ColumnHeartbeat(msgspec.Struct, gc=False):
    """A heartbeat in the columns encoding."""

    node_id: Id
    topic_names: Annotated[list[Topic], msgspec.Meta(max_length=MAX_TOPIC_REPORTS)]
    regions: RegionColumns
    addr: str | None = None
    topics: Annotated[list[TopicReport], msgspec.Meta(max_length=MAX_TOPIC_REPORTS)] | None = None


@dataclass(frozen=True, slots=True)
class Columns:
    """A columns heartbeat's regions as int64 arrays (`latest`/`manifest` None: all
    null), with `topic` indexing `topic_names`."""

    topic_names: list[str]
    topic: np.ndarray
    region_id: np.ndarray
    flushed: np.ndarray
    memtable: np.ndarray
    latest: np.ndarray | None
    manifest: np.ndarray | None

    def regions(self) -> list[RegionReport]:
        """The same regions one by one, as a JSON heartbeat would carry them."""
        n = len(self.region_id)
        names = self.topic_names
        return list(
            map(
                RegionReport,
                self.region_id.tolist(),
                [names[i] for i in self.topic.tolist()],
                self.flushed.tolist(),
                self.memtable.tolist(),
                _nullable(self.latest, n),
                _nullable(self.manifest, n),
            )
        )


_REGION_ID: Final = attrgetter("region_id")
_TOPIC: Final = attrgetter("topic")
_FLUSHED: Final = attrgetter("flushed_entry_id")
_MEMTABLE: Final = attrgetter("memtable_bytes")
_LATEST: Final = attrgetter("topic_latest_entry_id")
_MANIFEST: Final = attrgetter("manifest_version")


def reports_as_columns(regions: list[RegionReport]) -> Columns:
    """A JSON heartbeat's regions as columns, one C-level pass per field, so both
    encodings are judged alike."""
    n = len(regions)
    topics = list(map(_TOPIC, regions))
    names = list(dict.fromkeys(topics))
    index = {name: i for i, name in enumerate(names)}
    return Columns(
        topic_names=names,
        topic=np.fromiter(map(index.__getitem__, topics), np.int64, n),
        region_id=np.fromiter(map(_REGION_ID, regions), np.int64, n),
        flushed=np.fromiter(map(_FLUSHED, regions), np.int64, n),
        memtable=np.fromiter(map(_MEMTABLE, regions), np.int64, n),
        latest=_column_of_nullable(list(map(_LATEST, regions))),
        manifest=_column_of_nullable(list(map(_MANIFEST, regions))),
    )


_BELOW_ANY_ID: Final = -2
"""Below every valid entry id (-1 is "none")."""


def _column_of_nullable(values: list[int | None]) -> np.ndarray | None:
    """None: all null; else the column, a null as `NULL`. A value of `NULL` itself
    (-2**63, which a column reads as null) becomes -2: below -1 either way, it is
    rejected as `negative_id` as it must be (a manifest version is never negative)."""
    nulls = values.count(None)
    if nulls == len(values):
        return None
    if NULL in values:
        values = [_BELOW_ANY_ID if v == NULL else v for v in values]
    if nulls:
        values = [NULL if v is None else v for v in values]
    return np.array(values, np.int64)


def _nullable(column: np.ndarray | None, n: int) -> list[int | None]:
    if column is None:
        return [None] * n
    values: list[int | None] = column.tolist()
    if (column == NULL).any():
        values = [None if v == NULL else v for v in values]
    return values


_json_decode: Final = msgspec.json.Decoder(Heartbeat).decode
_msgpack_decode: Final = msgspec.msgpack.Decoder(ColumnHeartbeat).decode


def decode_json(body: bytes) -> Heartbeat:
    """A JSON heartbeat, or `SchemaError` naming the first field that is wrong."""
    try:
        return _json_decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise refusal(exc, "JSON") from None


def decode_columns(body: bytes) -> ColumnHeartbeat:
    """A columns heartbeat, or `SchemaError` naming the first field that is wrong."""
    try:
        return _msgpack_decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise refusal(exc, "msgpack") from None


def columns_of(doc: ColumnHeartbeat) -> Columns:
    """The heartbeat's region columns as arrays, checked: one int64 per region in every
    column, topic indexes into `topic_names`, memtable sizes and manifest versions in
    range, at most `MAX_REGIONS` regions."""
    raw = doc.regions
    loc: list[Any] = ["regions"]
    if len(raw.region_id) % 8:
        raise invalid("region_id must hold int64 values (8 bytes each)", [*loc, "region_id"])
    n = len(raw.region_id) // 8
    if n > MAX_REGIONS:
        raise invalid(f"a heartbeat may report at most {MAX_REGIONS} regions", loc)

    def column(name: str, data: bytes) -> np.ndarray:
        if len(data) != 8 * n:
            raise invalid(f"{name} must hold {n} int64 values, as region_id", [*loc, name])
        return np.frombuffer(data, dtype="<i8")

    latest, manifest = raw.topic_latest_entry_id, raw.manifest_version
    cols = Columns(
        topic_names=doc.topic_names,
        topic=column("topic", raw.topic),
        region_id=np.frombuffer(raw.region_id, dtype="<i8"),
        flushed=column("flushed_entry_id", raw.flushed_entry_id),
        memtable=column("memtable_bytes", raw.memtable_bytes),
        latest=None if latest is None else column("topic_latest_entry_id", latest),
        manifest=None if manifest is None else column("manifest_version", manifest),
    )
    if n == 0:
        return cols
    if cols.topic.min() < 0 or cols.topic.max() >= len(doc.topic_names):
        raise invalid("topic must index topic_names", [*loc, "topic"])
    if cols.memtable.min() < 0:
        raise invalid("memtable_bytes must be >= 0", [*loc, "memtable_bytes"])
    if cols.manifest is not None and ((cols.manifest < 0) & (cols.manifest != NULL)).any():
        raise invalid("manifest_version must be >= 0 or null", [*loc, "manifest_version"])
    return cols


def encode_columns(
    node_id: int,
    addr: str | None,
    regions: list[tuple[int, str, int, int | None, int, int | None]],
    topics: list[dict[str, Any]] | None = None,
) -> bytes:
    """A columns heartbeat body from regions, each `(region_id, topic, flushed_entry_id,
    topic_latest_entry_id, memtable_bytes, manifest_version)`: what a datanode written
    in Python would send."""
    names: dict[str, int] = {}
    columns: list[list[int | None]] = [[] for _ in range(6)]
    for region_id, topic, flushed, latest, memtable, manifest in regions:
        index = names.setdefault(topic, len(names))
        for values, value in zip(
            columns, (index, region_id, flushed, memtable, latest, manifest), strict=True
        ):
            values.append(value)

    def column(values: list[int | None]) -> bytes:
        return np.array([NULL if v is None else v for v in values], dtype="<i8").tobytes()

    fields = (
        "topic",
        "region_id",
        "flushed_entry_id",
        "memtable_bytes",
        "topic_latest_entry_id",
        "manifest_version",
    )
    return msgspec.msgpack.encode(
        {
            "node_id": node_id,
            "addr": addr,
            "topic_names": list(names),
            "regions": {name: column(values) for name, values in zip(fields, columns, strict=True)},
            "topics": topics,
        }
    )
