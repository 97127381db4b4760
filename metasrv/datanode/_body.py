"""The heartbeat body a datanode sends, in either encoding of DESIGN §5.

- `json`: the DESIGN §5 object as it is (`application/json`).
- `columns`: msgpack (`application/msgpack`) with each region field as one column, a
  msgpack `bin` of little-endian int64s, one per region, in the same region order in
  every column; each region's topic is an index into `topic_names` (first appearance
  order). A null `topic_latest_entry_id` or `manifest_version` is `NULL` (-2**63) in its
  column; a column whose every value is null is left out. The map's keys come in this
  order: `node_id`, `addr`, `topic_names`, `regions`, `topics`; `addr` and `topics` are
  msgpack nil when absent.

The columns writer below uses only the standard library (`struct`), and writes every
msgpack value in its shortest form, so its bytes are the ones in tests/vectors/heartbeat/;
the server's decoder (`metasrv.wire.decode_columns`) reads any valid msgpack form.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final, Literal

from metasrv import wire
from metasrv.errors import InvalidArgument

Encoding = Literal["json", "columns"]
Body = wire.Heartbeat | Mapping[str, Any]
"""A heartbeat as the `metasrv.wire` struct, or as the DESIGN §5 JSON object."""

CONTENT_TYPES: Final[dict[str, str]] = {
    "json": "application/json",
    "columns": "application/msgpack",
}
_FIELDS: Final = ("topic", "region_id", "flushed_entry_id", "memtable_bytes")
_NULLABLE: Final = ("topic_latest_entry_id", "manifest_version")


def encode_heartbeat(body: Body, encoding: Encoding = "json") -> tuple[bytes, str]:
    """The request body and its content type."""
    if encoding == "json":
        return wire.encode(body), CONTENT_TYPES["json"]
    if encoding == "columns":
        heartbeat = body if isinstance(body, wire.Heartbeat) else as_heartbeat(body)
        return encode_columns(heartbeat), CONTENT_TYPES["columns"]
    raise InvalidArgument(f"unknown heartbeat encoding {encoding!r} (json or columns)")


def as_heartbeat(body: Mapping[str, Any]) -> wire.Heartbeat:
    """A DESIGN §5 JSON object as the wire struct (checked as the server checks it)."""
    return wire.decode_json(wire.encode(body))


def encode_columns(heartbeat: wire.Heartbeat) -> bytes:
    """The columns encoding of `heartbeat` (see the module docstring)."""
    names: dict[str, int] = {}
    topic: list[int] = []
    region_id: list[int] = []
    flushed: list[int] = []
    memtable: list[int] = []
    latest: list[int] = []
    manifest: list[int] = []
    latest_seen = manifest_seen = False
    for r in heartbeat.regions:
        topic.append(names.setdefault(r.topic, len(names)))
        region_id.append(r.region_id)
        flushed.append(r.flushed_entry_id)
        memtable.append(r.memtable_bytes)
        if r.topic_latest_entry_id is None:
            latest.append(wire.NULL)
        else:
            latest.append(r.topic_latest_entry_id)
            latest_seen = True
        if r.manifest_version is None:
            manifest.append(wire.NULL)
        else:
            manifest.append(r.manifest_version)
            manifest_seen = True
    columns = dict(zip(_FIELDS, (topic, region_id, flushed, memtable), strict=True))
    if latest_seen:
        columns["topic_latest_entry_id"] = latest
    if manifest_seen:
        columns["manifest_version"] = manifest
    out = [_map(5), _str("node_id"), _int(heartbeat.node_id)]
    out += [_str("addr"), _nil() if heartbeat.addr is None else _str(heartbeat.addr)]
    out += [_str("topic_names"), _array(len(names)), *map(_str, names)]
    out += [_str("regions"), _map(len(columns))]
    for name, values in columns.items():
        out += [_str(name), _bin(struct.pack(f"<{len(values)}q", *values))]
    out.append(_str("topics"))
    if heartbeat.topics is None:
        out.append(_nil())
    else:
        out.append(_array(len(heartbeat.topics)))
        for t in heartbeat.topics:
            out += [_map(4), _str("topic"), _str(t.topic)]
            out += [_str("latest_entry_id"), _int(t.latest_entry_id)]
            out += [_str("record_size"), _int(t.record_size)]
            out += [_str("record_num"), _int(t.record_num)]
    return b"".join(out)


# --- msgpack, the few types the body uses, each in its shortest form ------------------------


def _nil() -> bytes:
    return b"\xc0"


def _int(value: int) -> bytes:
    if 0 <= value < 0x80:
        return bytes((value,))  # positive fixint
    if -32 <= value < 0:
        return struct.pack(">b", value)  # negative fixint
    if value >= 0:
        for marker, fmt, top in ((0xCC, ">B", 8), (0xCD, ">H", 16), (0xCE, ">I", 32)):
            if value < 1 << top:
                return bytes((marker,)) + struct.pack(fmt, value)
        return b"\xcf" + struct.pack(">Q", value)  # uint 64 (struct refuses >= 2**64)
    for marker, fmt, top in ((0xD0, ">b", 7), (0xD1, ">h", 15), (0xD2, ">i", 31)):
        if value >= -(1 << top):
            return bytes((marker,)) + struct.pack(fmt, value)
    return b"\xd3" + struct.pack(">q", value)  # int 64


def _sized(data: bytes, fix: tuple[int, int] | None, markers: tuple[int, int, int]) -> bytes:
    """`data` after its length: a fix form (base, limit) or 8/16/32-bit length markers."""
    n = len(data)
    if fix is not None and n < fix[1]:
        return bytes((fix[0] | n,)) + data
    for marker, fmt, top in zip(markers, (">B", ">H", ">I"), (8, 16, 32), strict=True):
        if n < 1 << top:
            return bytes((marker,)) + struct.pack(fmt, n) + data
    raise InvalidArgument(f"a msgpack value of {n} bytes is too long")


def _str(value: str) -> bytes:
    return _sized(value.encode(), (0xA0, 32), (0xD9, 0xDA, 0xDB))


def _bin(value: bytes) -> bytes:
    return _sized(value, None, (0xC4, 0xC5, 0xC6))


def _header(n: int, fix: int, m16: int, m32: int) -> bytes:
    if n < 16:
        return bytes((fix | n,))
    if n < 1 << 16:
        return bytes((m16,)) + struct.pack(">H", n)
    return bytes((m32,)) + struct.pack(">I", n)


def _array(n: int) -> bytes:
    return _header(n, 0x90, 0xDC, 0xDD)


def _map(n: int) -> bytes:
    return _header(n, 0x80, 0xDE, 0xDF)
