"""The slots of each datanode's regions, kept between its heartbeats (`SlotMemo`).

A datanode reports the same regions in the same order heartbeat after heartbeat, so
comparing two arrays replaces a dict lookup per region (a cache miss each, at a million
regions). A memo is valid only while no row of the table has been discarded since: a
freed slot may be handed to another region.
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

    def recall(self, key: int, region_ids: np.ndarray, discards: int) -> np.ndarray | None:
        """The slots remembered under `key` if `region_ids` are the same ids in the same
        order and the table's discard count is still `discards`; else None."""
        kept = self._recent.get(key)
        if kept is None or kept[0] != discards or not np.array_equal(kept[1], region_ids):
            return None
        return kept[2]

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
