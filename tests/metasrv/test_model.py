"""The domain rules of `metasrv.model`; a rule stated for one region and again a column at
a time must give the same answer in both forms on every input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metasrv.model import (
    NULL,
    RegionStat,
    TopicStat,
    idle_claim_ignored,
    idle_claims_ignored,
    prunable_entry_id,
    prunable_entry_ids,
    replay_start_entry_id,
)

_entry_id = st.integers(min_value=-1, max_value=2**63 - 1)
_region = st.tuples(
    _entry_id,  # flushed_entry_id
    st.one_of(st.none(), _entry_id),  # topic_latest_entry_id
    st.one_of(st.just(0), st.integers(min_value=0, max_value=2**63 - 1)),  # memtable_bytes
)


def test_an_idle_claim_counts_only_with_an_empty_memtable() -> None:
    assert prunable_entry_id(10, None, 0) == 10
    assert prunable_entry_id(10, 50, 0) == 50  # idle: the topic's latest id
    assert prunable_entry_id(10, 5, 0) == 10  # never below the flushed id
    assert prunable_entry_id(10, 50, 1) == 10  # unflushed data: the claim is not trusted
    assert idle_claim_ignored(50, 1) and not idle_claim_ignored(50, 0)
    assert not idle_claim_ignored(None, 1)
    stat = RegionStat(1, 1, "t", 10, 50, 4096, None, 0.0)
    assert stat.prunable_entry_id == 10 and stat.idle_claim_ignored


@given(st.lists(_region, max_size=50))
def test_the_column_form_is_the_scalar_form(regions: list[tuple[int, int | None, int]]) -> None:
    flushed = np.array([r[0] for r in regions], np.int64)
    latest = np.array([NULL if r[1] is None else r[1] for r in regions], np.int64)
    memtable = np.array([r[2] for r in regions], np.int64)
    assert prunable_entry_ids(flushed, latest, memtable).tolist() == [
        prunable_entry_id(*r) for r in regions
    ]
    assert idle_claims_ignored(latest, memtable).tolist() == [
        idle_claim_ignored(r[1], r[2]) for r in regions
    ]


def _stat(flushed: int, latest: int | None = None, memtable_bytes: int = 0) -> RegionStat:
    return RegionStat(1, 1, "t", flushed, latest, memtable_bytes, None, 0.0)


@pytest.mark.parametrize(
    ("stat", "checkpoint", "pruned", "start"),
    [
        (None, None, None, 0),  # nothing known, never purged: from the first entry
        (None, None, 40, 41),  # nothing at or below the marker is readable
        (None, 25, None, 26),  # a checkpoint is a prunable id, used until a stat arrives
        (None, 25, 40, 41),
        (None, 60, 40, 61),
        (_stat(10), 25, None, 11),  # a live stat is what the region says now: it wins
        (_stat(10), None, 40, 41),
        (_stat(50), None, 40, 51),
        (_stat(10, latest=90), None, 40, 91),  # idle: nothing needed up to the topic's latest
        (_stat(10, latest=90, memtable_bytes=1), None, 40, 41),  # claim beside unflushed data
        (_stat(-1), None, None, 0),
    ],
)
def test_replay_start_is_one_past_the_prunable_id_or_the_marker(
    stat: RegionStat | None, checkpoint: int | None, pruned: int | None, start: int
) -> None:
    assert replay_start_entry_id(stat, checkpoint, pruned) == start


@pytest.mark.parametrize(
    ("stat", "checkpoint", "pruned", "in_flight", "start"),
    [
        # Issue #34: an idle region's claim (1) was replaced by a lower report (-1) after
        # a purge to 1 re-validated; its marker write and DeleteRecords(1) may land later.
        (_stat(-1), None, None, 1, 2),
        (_stat(-1), None, 0, 1, 2),
        (None, None, None, 7, 8),  # no stat, no checkpoint: still not below the purge
        (None, 3, None, 7, 8),
        (_stat(10), None, 4, 7, 11),  # a higher prunable id or marker still wins
        (_stat(3), None, 9, 7, 10),
        (_stat(3), None, 1, None, 4),  # no purge in flight: the rule as before
    ],
)
def test_replay_start_is_never_below_the_target_of_a_purge_in_flight(
    stat: RegionStat | None,
    checkpoint: int | None,
    pruned: int | None,
    in_flight: int | None,
    start: int,
) -> None:
    assert replay_start_entry_id(stat, checkpoint, pruned, in_flight) == start


@given(
    _region,
    st.one_of(st.none(), _entry_id),
    st.one_of(st.none(), _entry_id),
    st.one_of(st.none(), _entry_id),
)
def test_a_purge_in_flight_only_raises_the_replay_start(
    region: tuple[int, int | None, int],
    checkpoint: int | None,
    pruned: int | None,
    in_flight: int | None,
) -> None:
    flushed, latest, memtable = region
    stat = _stat(flushed, latest, memtable)
    for known in (stat, None):
        without = replay_start_entry_id(known, checkpoint, pruned)
        with_purge = replay_start_entry_id(known, checkpoint, pruned, in_flight)
        assert with_purge == (without if in_flight is None else max(without, in_flight + 1))


def test_a_topic_estimates_bytes_as_entries_times_its_average_record_size() -> None:
    stat = TopicStat("wal_0", latest_entry_id=100, avg_record_size=512.5, received_at=0.0)
    assert stat.bytes_of(40) == 20_500.0
    assert stat.bytes_of(0) == 0.0
