"""The heartbeat test vectors (tests/vectors/heartbeat/): the server's decoder reads every
one as its JSON file says, and the client's encoder writes exactly its bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from metasrv import wire
from metasrv.datanode import as_heartbeat, encode_columns, encode_heartbeat
from tests.metasrv.datanode._vectors import DIR, VECTORS, annotate, read_hex, title

NAMES = sorted(VECTORS)


def meaning(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DIR / f"{name}.json").read_text())
    return loaded


def as_json(heartbeat: wire.Heartbeat, regions: list[wire.RegionReport]) -> dict[str, Any]:
    """A decoded heartbeat as the plain JSON object, for comparing with a vector."""
    plain: dict[str, Any] = msgspec.to_builtins(heartbeat)
    plain["regions"] = msgspec.to_builtins(regions)
    return plain


def test_the_directory_holds_exactly_the_vectors() -> None:
    files = {p.name for p in DIR.iterdir() if p.suffix in (".json", ".hex")}
    assert files == {f"{n}.json" for n in NAMES} | {f"{n}.msgpack.hex" for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_the_json_file_is_the_vector(name: str) -> None:
    assert meaning(name) == VECTORS[name]


@pytest.mark.parametrize("name", NAMES)
def test_the_server_decodes_the_json_body_as_written(name: str) -> None:
    body = (DIR / f"{name}.json").read_bytes()
    decoded = wire.decode_json(body)
    assert as_json(decoded, decoded.regions) == meaning(name)


@pytest.mark.parametrize("name", NAMES)
def test_the_server_decodes_the_columns_bytes_to_the_json_meaning(name: str) -> None:
    doc = wire.decode_columns(read_hex(DIR / f"{name}.msgpack.hex"))
    regions = wire.columns_of(doc).regions()
    heartbeat = wire.Heartbeat(node_id=doc.node_id, regions=[], addr=doc.addr, topics=doc.topics)
    assert as_json(heartbeat, regions) == meaning(name)


@pytest.mark.parametrize("name", NAMES)
def test_the_client_writes_exactly_the_vector_bytes(name: str) -> None:
    expected = read_hex(DIR / f"{name}.msgpack.hex")
    assert encode_columns(as_heartbeat(meaning(name))) == expected
    # From a plain JSON object too, as `DatanodeClient(encoding="columns")` takes it.
    assert encode_heartbeat(meaning(name), "columns") == (expected, "application/msgpack")


@pytest.mark.parametrize("name", NAMES)
def test_the_client_json_body_is_the_vector(name: str) -> None:
    body, content_type = encode_heartbeat(as_heartbeat(meaning(name)), "json")
    assert content_type == "application/json"
    assert json.loads(body) == meaning(name)


@pytest.mark.parametrize("name", NAMES)
def test_the_annotations_say_what_the_bytes_are(name: str) -> None:
    path = DIR / f"{name}.msgpack.hex"
    assert path.read_text() == annotate(read_hex(path), title(name))


@pytest.mark.parametrize("name", NAMES)
def test_the_servers_own_python_encoder_agrees(name: str) -> None:
    """`wire.encode_columns` (what benchmarks send) writes every column, nulls included:
    other bytes, the same meaning."""
    vector = meaning(name)
    rows = [
        (
            r["region_id"],
            r["topic"],
            r["flushed_entry_id"],
            r["topic_latest_entry_id"],
            r["memtable_bytes"],
            r["manifest_version"],
        )
        for r in vector["regions"]
    ]
    doc = wire.decode_columns(
        wire.encode_columns(vector["node_id"], vector["addr"], rows, vector["topics"])
    )
    heartbeat = wire.Heartbeat(node_id=doc.node_id, regions=[], addr=doc.addr, topics=doc.topics)
    assert as_json(heartbeat, wire.columns_of(doc).regions()) == vector


def test_the_hex_reader_ignores_comments_and_spacing(tmp_path: Path) -> None:
    path = tmp_path / "x.msgpack.hex"
    path.write_text("# title\n85  # map\n  a7 6e6f 64 65 5f 69 64 # str\n")
    assert read_hex(path) == bytes.fromhex("85a76e6f64655f6964")
