"""The slots of each datanode's regions, kept between its heartbeats (`SlotMemo`).

A datanode reports the same regions in the same order heartbeat after heartbeat, so
comparing two arrays replaces a dict lookup per region (a cache miss each, at a million
regions). A memo is valid only while no row of the table has been discarded since: a
freed slot may be handed to another region.

Before a datanode's first heartbeat of a term, the map's word is kept instead (`expect`):
the regions mapped to it, ascending, and their prepared slots. A first heartbeat that names
exactly those, in any order, is matched by one sort instead of a lookup and a duplicate
check of every region; it is then remembered as sent.
"""

from __future__ import annotations

import numpy as np


class SlotMemo:
    """Key (a datanode) -> the slots of the region ids it named, with the table's discard
    count at the time (`StatTable.recall` and `remember`)."""

    def __init__(self) -> None:
        self._recent: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        """Key -> (discards then, its region ids, their slots)."""
        self._remembered = 0
        """Region ids held in `_recent` (16 bytes each with their slots)."""
        self._expected: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        """Key -> (discards then, its mapped region ids ascending, their slots), until its
        first `recall`."""

    def recall(
        self, key: int, region_ids: np.ndarray, discards: int, rows: int
    ) -> np.ndarray | None:
        """The slots remembered under `key` if `region_ids` are the same ids in the same
        order and the table's discard count (of `rows` rows) is still `discards`, or
        those `expect`ed if they are the same ids; else None."""
        kept = self._recent.get(key)
        if kept is not None and kept[0] == discards and np.array_equal(kept[1], region_ids):
            return kept[2]
        expected = self._expected.pop(key, None)
        if expected is None or expected[0] != discards or len(expected[1]) != len(region_ids):
            return None
        order = np.argsort(region_ids, kind="stable")
        if not np.array_equal(region_ids[order], expected[1]):
            return None
        slots = np.empty(len(order), np.intp)
        slots[order] = expected[2]
        self.remember(key, region_ids, slots, discards, rows)
        return slots

    def expect(
        self, keys: np.ndarray, region_ids: np.ndarray, slots: np.ndarray, discards: int
    ) -> None:
        """Keep, per key of `keys`, the distinct `region_ids` (ascending) it is mapped
        and their `slots`, all three aligned, for its first `recall`."""
        if not len(keys):
            return
        order = np.argsort(keys, kind="stable")
        keys, region_ids, slots = keys[order], region_ids[order], slots[order]
        firsts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]).tolist()
        ends = [*firsts[1:], len(keys)]
        for first, end, key in zip(firsts, ends, keys[firsts].tolist(), strict=True):
            self._expected[key] = (discards, region_ids[first:end], slots[first:end])

    def remember(
        self, key: int, region_ids: np.ndarray, slots: np.ndarray, discards: int, rows: int
    ) -> None:
        """Keep `slots` of distinct `region_ids` under `key`, in a table of `rows` rows."""
        recent = self._recent
        old = recent.pop(key, None)
        if old is not None:
            self._remembered -= len(old[1])
        # At most twice as many regions as there are rows (a datanode's list, and one
        # more for each region that moved between datanodes), oldest dropped first: a
        # flood of invented datanode ids cannot grow it further.
        bound = 2 * rows
        while recent and self._remembered + len(region_ids) > bound:
            self._remembered -= len(recent.pop(next(iter(recent)))[1])
        recent[key] = (discards, region_ids.copy(), slots)
        self._remembered += len(region_ids)
