"""The domain rules of `metasrv.model`."""

from __future__ import annotations

import pytest

from metasrv.model import RegionStat, replay_start_entry_id


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
