"""The kv key layout of DESIGN §4 and the codec of each key's value, in one place.

Values are JSON. Encoders write exactly the shape shown beside each key; decoders are
the only code that reads those values back.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from metasrv.errors import DamagedMarker
from metasrv.model import RegionRoute

logger = logging.getLogger(__name__)

TOPIC_NAME_PREFIX = "__topic_name/kafka/"
TOPIC_REGION_PREFIX = "__topic_region/"
PROCEDURE_PREFIX = "__procedure__/"
ELECTION_KEY = "__metasrv_election"
LOCK_PREFIX = "__remote_wal_lock/"


# --- `__topic_name/kafka/{topic}` -> {"pruned_entry_id": int|null, "topic_id": str|null,
#     "reset": {...}|null} ----------------------------------------------------------------


def topic_name(topic: str) -> str:
    """`__topic_name/kafka/{topic}` -> {"pruned_entry_id": int|null, "topic_id": str|null,
    "reset": {"detected_topic_id": str|null, "high_watermark": int|null, "reason": str}|null}"""
    return f"{TOPIC_NAME_PREFIX}{topic}"


@dataclass(frozen=True, slots=True)
class ResetLatch:
    """A topic reset (DESIGN §2 invariant 8) as the marker keeps it until an operator
    resolves it: what Kafka showed when the reset was found."""

    reason: str
    detected_topic_id: str | None = None
    """Kafka's topic id when the reset was found (None when Kafka gave none)."""
    high_watermark: int | None = None


@dataclass(frozen=True, slots=True)
class Marker:
    """A topic's marker value. `topic_id` is the Kafka topic id (UUID, as Kafka prints it)
    of the topic the marker's offsets belong to: a topic deleted and recreated under the
    same name gets a new id and starts again at offset 0. Recorded by the first
    registration on the topic (`registered_marker`) and at every advance; None on a
    marker written before metasrv recorded ids."""

    pruned_entry_id: int | None = None
    topic_id: str | None = None
    reset: ResetLatch | None = None


def registered_marker(marker: Marker | None, kafka_topic_id: str) -> Marker | None:
    """The marker a registration writes before a region's first route on a topic: one
    recording Kafka's `kafka_topic_id`, so the regions' reports are tied to the topic they
    wrote to and a recreation is a topic reset even before the first purge (invariant 8).
    None when there is nothing to write: an id is recorded already (the purge compares it
    with Kafka's) or a reset is latched (only an operator clears it)."""
    if marker is None:
        return Marker(None, kafka_topic_id)
    if marker.topic_id is not None or marker.reset is not None:
        return None
    return Marker(marker.pruned_entry_id, kafka_topic_id)


def decode_marker(value: bytes) -> Marker:
    """A marker value; `ValueError` for a value of any other shape (not JSON, not an
    object, an entry id that is not an int, a topic id that is not a string, a reset
    that is not an object with a string reason)."""
    decoded = orjson.loads(value)
    if not isinstance(decoded, dict):
        raise ValueError(f"marker value is not a JSON object: {value!r}")
    pruned = decoded.get("pruned_entry_id")
    if pruned is not None and type(pruned) is not int:
        raise ValueError(f"pruned_entry_id is not an int: {pruned!r}")
    topic_id = decoded.get("topic_id")
    if topic_id is not None and not isinstance(topic_id, str):
        raise ValueError(f"topic_id is not a string: {topic_id!r}")
    raw_reset = decoded.get("reset")
    reset: ResetLatch | None = None
    if raw_reset is not None:
        if not isinstance(raw_reset, dict) or not isinstance(raw_reset.get("reason"), str):
            raise ValueError(f"reset is not an object with a reason: {raw_reset!r}")
        detected = raw_reset.get("detected_topic_id")
        high = raw_reset.get("high_watermark")
        if detected is not None and not isinstance(detected, str):
            raise ValueError(f"reset.detected_topic_id is not a string: {detected!r}")
        if high is not None and type(high) is not int:
            raise ValueError(f"reset.high_watermark is not an int: {high!r}")
        reset = ResetLatch(raw_reset["reason"], detected, high)
    return Marker(pruned, topic_id, reset)


def encode_marker(marker: Marker, stored: bytes | None = None) -> bytes:
    """The value for `marker`, keeping any other field of the `stored` value it replaces
    (one another writer of the key may have added)."""
    value = orjson.loads(stored) if stored is not None else {}
    value["pruned_entry_id"] = marker.pruned_entry_id
    value["topic_id"] = marker.topic_id
    reset = marker.reset
    value["reset"] = (
        None
        if reset is None
        else {
            "reason": reset.reason,
            "detected_topic_id": reset.detected_topic_id,
            "high_watermark": reset.high_watermark,
        }
    )
    return orjson.dumps(value)


def read_marker(key: str, value: bytes) -> Marker:
    """The marker stored at `key`; `DamagedMarker` (logged with the value) when it does not
    decode. The policy where one topic's marker decides something (a purge, an operator's
    resolve, a replay start): fail, never guess "never purged"."""
    try:
        return decode_marker(value)
    except ValueError as exc:
        topic = key.removeprefix(TOPIC_NAME_PREFIX)
        logger.error("damaged marker", extra={"topic": topic, "value": value[:200]})
        raise DamagedMarker(
            f"the marker of {topic} is damaged ({value[:80]!r}: {exc}): repair the key {key} "
            "by hand (a JSON object with an int or null pruned_entry_id)",
            details={"topic": topic, "key": key},
        ) from exc


def marker_or_none(key: str, value: bytes) -> Marker | None:
    """The marker stored at `key`; None (logged) when it does not decode. The policy of a
    view over every topic (the ticker's and the API's lists, the leader's marker reads, the
    reconcile job, which counts them): a damaged marker is left out and read as absent,
    and the purge of that topic fails on it (`read_marker`)."""
    try:
        return decode_marker(value)
    except ValueError:
        logger.error("damaged marker; read as absent", extra={"key": key})
        return None


# --- `__topic_region/{topic}/{region_id}` -> {"node_id": int, "checkpoint": ...} --------


def topic_region(topic: str, region_id: int) -> str:
    """`__topic_region/{topic}/{region_id}` -> {"node_id": int, "checkpoint": {...}|null}"""
    return f"{TOPIC_REGION_PREFIX}{topic}/{region_id}"


def parse_topic_region(key: str) -> tuple[str, int]:
    """Inverse of `topic_region`: (topic, region_id)."""
    rest = key[len(TOPIC_REGION_PREFIX) :]
    topic, _, region = rest.rpartition("/")
    return topic, int(region)


def encode_route(node_id: int, checkpoint_entry_id: int | None) -> bytes:
    """`{"node_id": ..., "checkpoint": {"entry_id": ...}|null}`, byte for byte what
    `orjson.dumps` makes of it, at a third of its cost (a checkpoint flush encodes one
    per changed region)."""
    if checkpoint_entry_id is None:
        return b'{"node_id":%d,"checkpoint":null}' % node_id
    return b'{"node_id":%d,"checkpoint":{"entry_id":%d}}' % (node_id, checkpoint_entry_id)


def decode_route(key: str, value: bytes) -> RegionRoute | None:
    """One `__topic_region/{topic}/{region_id}` key and value as a route; None (logged)
    when the key is not one.

    A key whose value is damaged still maps its region (node -1, no checkpoint):
    dropping it would let a purge ignore a region that may need entries.
    """
    try:
        topic, region_id = parse_topic_region(key)
    except ValueError:
        logger.error("ignoring malformed topic-region key", extra={"key": key})
        return None
    node_id = -1
    checkpoint: int | None = None
    try:
        decoded = orjson.loads(value)
        node = decoded.get("node_id")
        if type(node) is int:
            node_id = node
        cp = decoded.get("checkpoint")
        if isinstance(cp, dict) and type(cp.get("entry_id")) is int:
            checkpoint = cp["entry_id"]
    except (orjson.JSONDecodeError, AttributeError):
        logger.error("damaged topic-region value; keeping the region mapped", extra={"key": key})
    return RegionRoute(
        region_id=region_id, topic=topic, node_id=node_id, checkpoint_entry_id=checkpoint
    )


def decode_route_page(page_keys: Sequence[str], values: Sequence[bytes]) -> dict[str, Any] | None:
    """`decode_route` of a page of keys at once, a column at a time with Arrow (the batch
    job: no Python object per region): `region_id`, `topic`, `node_id` and
    `checkpoint_entry_id` arrays; None when any key or value would not decode exactly as
    `decode_route` decodes it (a malformed key, a value of another shape): decode that page
    key by key."""
    import pyarrow as pa  # the batch job's; the daemon never loads it
    import pyarrow.compute as pc
    import pyarrow.json as pajson

    try:
        raw = pa.array(page_keys, pa.string())
        rest = pc.utf8_slice_codeunits(raw, len(TOPIC_REGION_PREFIX))
        parts = pc.split_pattern(rest, "/", max_splits=1, reverse=True)
        if pc.min(pc.list_value_length(parts)).as_py() != 2:
            return None
        topic = pc.list_element(parts, 0)
        region_text = pc.list_element(parts, 1)
        # Only plain decimal digits: what int() reads the same way.
        if not pc.all(pc.match_substring_regex(region_text, r"^[0-9]{1,19}$")).as_py():
            return None
        region_id = pc.cast(region_text, pa.int64())
        lines = b"\n".join(values)
        # One line per value, or the rows would not line up with the keys.
        if lines.count(b"\n") != len(values) - 1:
            return None
        decoded = pajson.read_json(pa.py_buffer(lines), parse_options=_route_json_options())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    if decoded.num_rows != len(values):
        return None
    checkpoint = decoded.column("checkpoint").combine_chunks()
    return {
        "region_id": region_id,
        "topic": topic,
        "node_id": pc.fill_null(decoded.column("node_id"), -1),
        "checkpoint_entry_id": pc.struct_field(checkpoint, [0]),
    }


@functools.cache
def _route_json_options() -> Any:
    """Arrow's JSON reader held to the route value's shape; other fields are ignored."""
    import pyarrow as pa
    import pyarrow.json as pajson

    schema = pa.schema(
        [
            pa.field("node_id", pa.int64()),
            pa.field("checkpoint", pa.struct([pa.field("entry_id", pa.int64())])),
        ]
    )
    return pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")


# --- `__metasrv_election` -> {"node": str, "addr": str, "term": int} -----------------------


@dataclass(frozen=True, slots=True)
class ElectionValue:
    """The leader's value of the election key (and of the SQL election's lease row): every
    leader-only kv write compares it (the fence), so it names the term."""

    node: str
    addr: str
    """The leader's HTTP address (`host:port`), where followers send clients."""
    term: int


def encode_election(value: ElectionValue) -> bytes:
    """`{"node":...,"addr":...,"term":...}`, compact, byte for byte what every version
    wrote (the fence compares the bytes)."""
    return json.dumps(
        {"node": value.node, "addr": value.addr, "term": value.term}, separators=(",", ":")
    ).encode()


def decode_election(value: bytes) -> ElectionValue:
    """The election key's value; `ValueError` for a value of any other shape (one another
    tool wrote). Only `addr` and `term` are required: `node` only names the leader."""
    info = json.loads(value)
    try:
        return ElectionValue(str(info.get("node", "")), str(info["addr"]), int(info["term"]))
    except (AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"not an election value: {value[:200]!r}") from exc


# --- procedures, locks ---------------------------------------------------------------


def procedure_prefix(procedure_id: str) -> str:
    """Prefix of every key of one procedure."""
    return f"{PROCEDURE_PREFIX}{procedure_id}/"


def lock(topic: str) -> str:
    """`__remote_wal_lock/{topic}`"""
    return f"{LOCK_PREFIX}{topic}"
