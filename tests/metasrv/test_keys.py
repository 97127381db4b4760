"""The kv value codecs of `metasrv.keys`: what each value decodes to, and what is refused."""

from __future__ import annotations

import orjson
import pytest

from metasrv import keys
from metasrv.errors import DamagedMarker
from metasrv.model import RegionRoute


@pytest.mark.parametrize(
    ("value", "pruned"),
    [
        (b'{"pruned_entry_id": 41}', 41),
        (b'{"pruned_entry_id": null}', None),
        (b"{}", None),
        (b'{"pruned_entry_id": 0, "other": "kept by writers"}', 0),
    ],
)
def test_decode_marker_reads_the_entry_id(value: bytes, pruned: int | None) -> None:
    assert keys.decode_marker(value).pruned_entry_id == pruned


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"",
        b"[]",
        b"7",
        b'{"pruned_entry_id": "5"}',
        b'{"pruned_entry_id": 1.5}',
        b'{"pruned_entry_id": true}',
    ],
)
def test_decode_marker_refuses_any_other_shape(value: bytes) -> None:
    with pytest.raises(ValueError):
        keys.decode_marker(value)


def test_encode_marker_round_trips_and_keeps_other_fields() -> None:
    assert keys.encode_marker(keys.Marker(12)) == (
        b'{"pruned_entry_id":12,"topic_id":null,"reset":null}'
    )
    stored = orjson.dumps({"pruned_entry_id": 3, "note": "x"})
    written = keys.encode_marker(keys.Marker(12, "id-1"), stored)
    assert orjson.loads(written) == {
        "pruned_entry_id": 12,
        "topic_id": "id-1",
        "reset": None,
        "note": "x",
    }
    assert keys.decode_marker(written) == keys.Marker(12, "id-1")


def test_decode_route_reads_what_encode_route_writes() -> None:
    key = keys.topic_region("t/with/slash", 2**63 - 1)
    assert keys.decode_route(key, keys.encode_route(4, 9)) == RegionRoute(
        2**63 - 1, "t/with/slash", 4, 9
    )
    assert keys.decode_route(key, keys.encode_route(4, None)) == RegionRoute(
        2**63 - 1, "t/with/slash", 4, None
    )


def test_decode_route_keeps_a_damaged_value_mapped_and_skips_a_bad_key() -> None:
    assert keys.decode_route(keys.topic_region("t", 5), b"not json") == RegionRoute(
        5, "t", -1, None
    )
    assert keys.decode_route(f"{keys.TOPIC_REGION_PREFIX}t/12x", keys.encode_route(1, None)) is None


def test_an_election_value_is_written_compactly_and_read_back() -> None:
    value = keys.ElectionValue("node-a", "10.0.0.1:4000", 7)
    encoded = keys.encode_election(value)
    # The fence compares these bytes: the layout every version wrote.
    assert encoded == b'{"node":"node-a","addr":"10.0.0.1:4000","term":7}'
    assert keys.decode_election(encoded) == value
    assert keys.decode_election(b'{"addr": "h:1", "term": "3"}') == keys.ElectionValue("", "h:1", 3)


@pytest.mark.parametrize(
    "value",
    [b"not json", b"[]", b'{"term": 1}', b'{"addr": "h:1"}', b'{"addr": "h:1", "term": "x"}'],
)
def test_an_election_value_of_another_shape_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        keys.decode_election(value)


def test_a_damaged_marker_fails_a_decision_and_is_absent_from_a_view() -> None:
    key = keys.topic_name("wal_3")
    assert keys.read_marker(key, b'{"pruned_entry_id": 9}') == keys.Marker(9)
    assert keys.marker_or_none(key, b'{"pruned_entry_id": 9}') == keys.Marker(9)
    with pytest.raises(DamagedMarker) as raised:
        keys.read_marker(key, b'{"pruned_entry_id": "nine"}')
    assert raised.value.details == {"topic": "wal_3", "key": key}
    assert keys.marker_or_none(key, b"not json") is None
