"""The heartbeat test vectors in tests/vectors/heartbeat/: their meaning, and the annotated
hex dump of their msgpack columns bytes.

Each vector NAME is two files: `NAME.json`, the heartbeat as the DESIGN §5 JSON body (every
field written out, nulls included), which is also what the columns bytes mean; and
`NAME.msgpack.hex`, those bytes as hex, one msgpack item per line with a `#` comment saying
what it is (to read the bytes: drop everything from `#` to the end of each line, then all
whitespace, and decode the hex).

`python -m tests.metasrv.datanode._vectors` rewrites the files from `VECTORS` with
`metasrv.datanode.encode_columns`; `test_vectors.py` checks them against the server's decoder
and the client's encoder.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Final

from metasrv.datanode import as_heartbeat, encode_columns

DIR: Final = Path(__file__).resolve().parents[2] / "vectors" / "heartbeat"
NULL: Final = -(2**63)


def _region(
    region_id: int,
    topic: str,
    flushed: int,
    memtable: int,
    latest: int | None = None,
    manifest: int | None = None,
) -> dict[str, Any]:
    return {
        "region_id": region_id,
        "topic": topic,
        "flushed_entry_id": flushed,
        "memtable_bytes": memtable,
        "topic_latest_entry_id": latest,
        "manifest_version": manifest,
    }


def _topic(topic: str, latest: int, size: int, num: int) -> dict[str, Any]:
    return {"topic": topic, "latest_entry_id": latest, "record_size": size, "record_num": num}


VECTORS: Final[dict[str, dict[str, Any]]] = {
    # A datanode hosting nothing: four empty columns, no nullable column, topics nil.
    "empty": {"node_id": 0, "addr": None, "regions": [], "topics": None},
    # One region (table 1, region 1) with 16 entries not flushed yet.
    "one_region": {
        "node_id": 7,
        "addr": "10.0.0.7:4001",
        "regions": [_region(1 << 32 | 1, "greptimedb_wal_topic_0", 41, 1024, None, 3)],
        "topics": [_topic("greptimedb_wal_topic_0", 57, 20480, 58)],
    },
    # Four regions on two topics, interleaved: topic indexes follow first appearance (wal_1
    # is 0); an idle region with an empty memtable reports the topic's latest entry id; a
    # region that has flushed nothing reports -1; nulls mixed into both nullable columns.
    "shared_topics": {
        "node_id": 12,
        "addr": None,
        "regions": [
            _region(1024 << 32 | 0, "wal_1", 99, 4096, None, 12),
            _region(1024 << 32 | 1, "wal_0", 7, 0, 310, None),
            _region(1025 << 32 | 0, "wal_1", -1, 512, None, 0),
            _region(1025 << 32 | 1, "wal_0", 305, 0, 310, 5),
        ],
        "topics": [_topic("wal_0", 310, 1_048_576, 311), _topic("wal_1", 120, 65_536, 121)],
    },
    # The ends of every range: ids and counters at 2**63-1 (uint 64), a 2**32 entry id
    # (uint 64), a 2**31 memtable (uint 32), a topic name of 40 characters (str 8).
    "limits": {
        "node_id": 2**63 - 1,
        "addr": "[::1]:4000",
        "regions": [
            _region(2**63 - 1, "t" * 40, 2**63 - 1, 2**31, 2**63 - 1, 2**63 - 1),
            _region(0, "t" * 40, -1, 0, -1, 0),
        ],
        "topics": [_topic("t" * 40, 2**32, 2**63 - 1, 2**63 - 1)],
    },
}


def columns_bytes(meaning: dict[str, Any]) -> bytes:
    """The client's columns encoding of a vector's JSON meaning."""
    return encode_columns(as_heartbeat(meaning))


def read_hex(path: Path) -> bytes:
    """The bytes of an annotated hex file."""
    return bytes.fromhex("".join(line.split("#", 1)[0] for line in path.read_text().splitlines()))


# --- the annotated dump: a small msgpack reader that says what each item is ------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        self.lines: list[str] = []

    def take(self, n: int) -> bytes:
        chunk = self.data[self.at : self.at + n]
        if len(chunk) != n:
            raise ValueError(f"truncated at byte {self.at}")
        self.at += n
        return chunk

    def emit(self, depth: int, raw: bytes, what: str) -> None:
        self.lines.append(f"{'  ' * depth}{raw.hex(' ')}".ljust(48) + f"  # {what}")

    def item(self, depth: int, column: str | None = None) -> Any:
        start = self.at
        lead = self.take(1)[0]
        if lead <= 0x7F or lead >= 0xE0:
            value = lead if lead <= 0x7F else lead - 0x100
            self.emit(depth, self.data[start : self.at], f"fixint {value}")
            return value
        ints = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q"}
        ints |= {0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
        if lead in ints:
            fmt = ints[lead]
            (value,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
            kind = ("uint" if fmt[1].isupper() else "int") + str(8 * struct.calcsize(fmt))
            self.emit(depth, self.data[start : self.at], f"{kind} {value}")
            return value
        if lead == 0xC0:
            self.emit(depth, self.data[start : self.at], "nil")
            return None
        if 0xA0 <= lead <= 0xBF or lead in (0xD9, 0xDA, 0xDB):
            n, form = (lead & 0x1F, "fixstr") if lead <= 0xBF else self.length(lead - 0xD9, "str")
            text = self.take(n).decode()
            self.emit(depth, self.data[start : self.at], f'{form}, {n} bytes: "{text}"')
            return text
        if lead in (0xC4, 0xC5, 0xC6):
            n, form = self.length(lead - 0xC4, "bin")
            self.emit(
                depth,
                self.data[start : self.at],
                f"{form}, {n} bytes: column {column}, {n // 8} int64 little-endian",
            )
            for i in range(n // 8):
                raw = self.take(8)
                (value,) = struct.unpack("<q", raw)
                shown = "NULL (-2**63)" if value == NULL else str(value)
                self.emit(depth + 1, raw, f"[{i}] {shown}")
            return None
        if 0x90 <= lead <= 0x9F or lead in (0xDC, 0xDD):
            n = lead & 0x0F if lead <= 0x9F else self.count(lead == 0xDD)
            self.emit(depth, self.data[start : self.at], f"array, {n} items")
            return [self.item(depth + 1) for _ in range(n)]
        if 0x80 <= lead <= 0x8F or lead in (0xDE, 0xDF):
            n = lead & 0x0F if lead <= 0x8F else self.count(lead == 0xDF)
            self.emit(depth, self.data[start : self.at], f"map, {n} entries")
            out = {}
            for _ in range(n):
                key = self.item(depth + 1)
                out[key] = self.item(depth + 1, column=key)
            return out
        raise ValueError(f"msgpack type 0x{lead:02x} is not used by the heartbeat")

    def length(self, size: int, name: str) -> tuple[int, str]:
        fmt = (">B", ">H", ">I")[size]
        (n,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return n, f"{name}{8 << size}"

    def count(self, wide: bool) -> int:
        fmt = ">I" if wide else ">H"
        (n,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return int(n)


def annotate(data: bytes, title: str) -> str:
    """`data` as the annotated hex file's text."""
    reader = _Reader(data)
    reader.item(0)
    if reader.at != len(data):
        raise ValueError(f"{len(data) - reader.at} bytes after the body")
    return "\n".join([f"# {title}", *reader.lines]) + "\n"


def title(name: str) -> str:
    return f"heartbeat vector {name!r}: {name}.json in the msgpack columns encoding"


def write(directory: Path = DIR) -> None:
    """Rewrite every vector's two files."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, meaning in VECTORS.items():
        (directory / f"{name}.json").write_text(json.dumps(meaning, indent=2) + "\n")
        (directory / f"{name}.msgpack.hex").write_text(
            annotate(columns_bytes(meaning), title(name))
        )


if __name__ == "__main__":
    write()
