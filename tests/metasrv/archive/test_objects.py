"""The archive's key codec and `covering` (metasrv/archive/_objects.py). Pure, no services;
`covering` is checked against a brute force over small ranges with Hypothesis."""

from __future__ import annotations

import itertools
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metasrv.archive import (
    MAX_ENTRY_ID,
    ArchivedRange,
    Coverage,
    covering,
    parse_object_key,
    topic_prefix,
)
from metasrv.errors import InvalidArgument

# --- the key codec -----------------------------------------------------------------------


def test_key_is_the_designs_shape() -> None:
    key = ArchivedRange("greptimedb_wal_topic_7", 0, 41).key("prod/")
    assert key == ("prod/greptimedb_wal_topic_7/00000000000000000000-00000000000000000041.parquet")
    assert topic_prefix("prod/", "greptimedb_wal_topic_7") == "prod/greptimedb_wal_topic_7/"


@given(
    prefix=st.sampled_from(["", "prod/", "a/b/", "x-"]),
    topic=st.from_regex(r"\A[A-Za-z0-9._-]{1,40}\Z"),
    first=st.integers(0, MAX_ENTRY_ID),
    length=st.integers(0, 10**6),
)
def test_parse_inverts_encode(prefix: str, topic: str, first: int, length: int) -> None:
    original = ArchivedRange(topic, first, min(first + length, MAX_ENTRY_ID))
    assert parse_object_key(prefix, original.key(prefix)) == original


@given(
    firsts=st.lists(st.integers(0, 10**12), min_size=2, max_size=20, unique=True),
)
def test_key_order_is_entry_order(firsts: list[int]) -> None:
    ranges = [ArchivedRange("t", f, f + 5) for f in firsts]
    assert sorted(r.key("p/") for r in ranges) == [r.key("p/") for r in sorted(ranges)]


@pytest.mark.parametrize(
    "key",
    [
        "other/t/00000000000000000000-00000000000000000001.parquet",  # another prefix
        "p/t/00000000000000000000-00000000000000000001.parquet.tmp",
        "p/t/0000000000000000000-00000000000000000001.parquet",  # 19 digits
        "p/t/000000000000000000000-00000000000000000001.parquet",  # 21 digits
        "p/t/00000000000000000002-00000000000000000001.parquet",  # first > last
        "p/t/99999999999999999999-99999999999999999999.parquet",  # past int64
        "p/t/+0000000000000000000-00000000000000000001.parquet",
        "p/t/00000000000000000000_00000000000000000001.parquet",
        "p/t/00000000000000000000-00000000000000000001.PARQUET",
        "p/t/x/00000000000000000000-00000000000000000001.parquet",  # nested
        "p//00000000000000000000-00000000000000000001.parquet",  # empty topic
        "p/t t/00000000000000000000-00000000000000000001.parquet",  # not a topic name
        "p/t",
        "p/t/",
        "p/",
    ],
)
def test_parse_rejects_any_other_key(key: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_object_key("p/", key)


@pytest.mark.parametrize(
    ("topic", "first", "last"),
    [("t", -1, 3), ("t", 4, 3), ("t", 0, MAX_ENTRY_ID + 1), ("", 0, 1), ("a/b", 0, 1)],
)
def test_a_range_that_no_key_can_name_is_refused(topic: str, first: int, last: int) -> None:
    with pytest.raises(InvalidArgument):
        ArchivedRange(topic, first, last)


# --- covering ------------------------------------------------------------------------------


def _r(first: int, last: int) -> ArchivedRange:
    return ArchivedRange("t", first, last)


def test_overlapping_objects_give_the_shortest_chain() -> None:
    objects = [_r(0, 9), _r(5, 14), _r(10, 19), _r(0, 3), _r(4, 19)]
    # (4, 19) and (10, 19) reach as far: the tie goes to the one starting latest.
    assert covering(objects, 0, 20) == Coverage((_r(0, 9), _r(10, 19)))
    assert covering(objects, 2, 20) == Coverage((_r(0, 9), _r(10, 19)))
    assert covering([*objects, _r(0, 19)], 0, 20) == Coverage((_r(0, 19),))


def test_a_gap_is_the_first_entries_no_object_holds() -> None:
    objects = [_r(0, 9), _r(15, 19), _r(25, 30)]
    assert covering(objects, 2, 28) == Coverage((), (10, 15))
    assert covering(objects, 20, 28) == Coverage((), (20, 25))
    assert covering(objects, 0, 40).gap == (10, 15)
    assert covering([_r(0, 9)], 5, 12).gap == (10, 12)
    assert covering([], 5, 12).gap == (5, 12)


def test_an_empty_range_needs_nothing() -> None:
    assert covering([], 7, 7) == Coverage(())
    assert covering([_r(0, 3)], 9, 2).covered


def test_objects_of_two_topics_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        covering([_r(0, 3), ArchivedRange("u", 4, 9)], 0, 10)


_SPAN = 40
ranges_st = st.lists(
    st.tuples(st.integers(0, _SPAN), st.integers(0, 12)).map(lambda t: _r(t[0], t[0] + t[1])),
    max_size=12,
)


def _held(objects: list[ArchivedRange]) -> set[int]:
    return {e for r in objects for e in range(r.first_entry_id, r.end)}


def _fewest(objects: list[ArchivedRange], start: int, end: int) -> int | None:
    """Fewest objects covering [start, end), by breadth-first search over positions."""
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        pos, used = queue.popleft()
        if pos >= end:
            return used
        for r in objects:
            if r.first_entry_id <= pos < r.end and r.end not in seen:
                seen.add(r.end)
                queue.append((r.end, used + 1))
    return None


@settings(max_examples=400)
@given(objects=ranges_st, start=st.integers(0, _SPAN + 5), length=st.integers(0, _SPAN))
def test_covering_agrees_with_brute_force(
    objects: list[ArchivedRange], start: int, length: int
) -> None:
    end = start + length
    found = covering(objects, start, end)
    held = _held(objects)
    missing = [e for e in range(start, end) if e not in held]
    if not missing:
        assert found.covered and found.gap is None
        chain = list(found.objects)
        assert all(r in objects for r in chain)
        if start < end:
            # In entry order, from start to end, each link touching or overlapping the last.
            assert chain[0].first_entry_id <= start and chain[-1].end >= end
            for a, b in itertools.pairwise(chain):
                assert b.first_entry_id <= a.end and b.end > a.end
            assert len(chain) == _fewest(objects, start, end)
        else:
            assert chain == []
    else:
        assert not found.covered and found.objects == ()
        gap_start = missing[0]
        later = [e for e in range(gap_start, end) if e in held]
        assert found.gap == (gap_start, later[0] if later else end)
