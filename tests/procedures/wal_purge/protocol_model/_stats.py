"""The planner's `TopicStats` port over the model's stats: a dict of `StatRow`s."""

from __future__ import annotations

from collections.abc import KeysView

import numpy as np

from metasrv.leader import StatRow


class ModelTopicStats:
    """`procedures.wal_purge.TopicStats` over `region id -> StatRow` (every row fresh or
    not as its `received_at` says)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: dict[int, StatRow]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def keys(self) -> KeysView[int]:
        return self._rows.keys()

    def get(self, region_id: int, /) -> StatRow | None:
        return self._rows.get(region_id)

    def rows_of(self, region_ids: list[int]) -> list[StatRow | None]:
        return [self._rows.get(r) for r in region_ids]

    def columns_of(self, region_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = self.rows_of(region_ids)
        found = np.array([row is not None for row in rows], dtype=bool)
        received = np.array([0.0 if row is None else row.received_at for row in rows])
        prunable = np.array(
            [0 if row is None else row.prunable_entry_id for row in rows], dtype=np.int64
        )
        return found, received, prunable

    def lowest_prunable(self, fresh_after: float) -> int | None:
        rows = self._rows.values()
        if not rows or min(row.received_at for row in rows) < fresh_after:
            return None
        return min(row.prunable_entry_id for row in rows)
