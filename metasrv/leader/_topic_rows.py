"""One topic's rows of a `StatTable` as a live, read-only mapping (`TopicRows`): what the
planner (`procedures.wal_purge.TopicStats`), the stat history and the API read."""

from __future__ import annotations

from collections.abc import Iterator, KeysView, Mapping
from itertools import repeat
from typing import Any, Protocol, overload

import numpy as np

from metasrv.leader._stat_rows import StatRow


class RowSource(Protocol):
    """What `TopicRows` reads: a `StatTable`, or one topic's rows copied (`TopicCopy`)."""

    def members(self, topic: str) -> dict[int, int]: ...
    def row(self, slot: int) -> StatRow: ...
    def rows(self, slots: np.ndarray) -> list[StatRow]: ...
    def received_at(self, slots: np.ndarray) -> np.ndarray: ...
    def prunable_at(self, slots: np.ndarray) -> np.ndarray: ...


class TopicRows(Mapping[int, StatRow]):
    """Live, read-only `region id -> StatRow` over one topic's rows in a `RowSource`.

    Rows are built on access; `keys()` is the table's own key view (so comparing it
    with another dict's keys is one C-level pass), and `lowest_prunable` answers the
    planner's question for the whole topic a column at a time.
    """

    __slots__ = ("_table", "topic")

    def __init__(self, table: RowSource, topic: str) -> None:
        self._table = table
        self.topic = topic

    @property
    def _members(self) -> dict[int, int]:
        return self._table.members(self.topic)

    def __getitem__(self, region_id: int) -> StatRow:
        return self._table.row(self._members[region_id])

    @overload
    def get(self, region_id: int, /) -> StatRow | None: ...
    @overload
    def get(self, region_id: int, /, default: Any) -> Any: ...
    def get(self, region_id: int, /, default: Any = None) -> Any:
        slot = self._members.get(region_id)
        return default if slot is None else self._table.row(slot)

    def __contains__(self, region_id: object) -> bool:
        return region_id in self._members

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._members))

    def __len__(self) -> int:
        return len(self._members)

    def keys(self) -> KeysView[int]:
        return self._members.keys()

    def items(self) -> list[tuple[int, StatRow]]:  # type: ignore[override]
        members = self._members
        ids = list(members)
        rows = self._table.rows(np.fromiter(members.values(), np.intp, len(ids)))
        return list(zip(ids, rows, strict=True))

    def values(self) -> list[StatRow]:  # type: ignore[override]
        members = self._members
        return self._table.rows(np.fromiter(members.values(), np.intp, len(members)))

    def _slots_of(self, region_ids: list[int]) -> np.ndarray:
        """Each region's slot among the topic's rows, -1 where it has none."""
        return np.fromiter(map(self._members.get, region_ids, repeat(-1)), np.intp, len(region_ids))

    def rows_of(self, region_ids: list[int]) -> list[StatRow | None]:
        """Each region's row, None where the topic has none, built a column at a time
        (the planner's per-region pass over a topic with missing or stale stats)."""
        slots = self._slots_of(region_ids)
        found = slots >= 0
        if found.all():
            return list(self._table.rows(slots))
        out: list[StatRow | None] = [None] * len(region_ids)
        at = np.flatnonzero(found).tolist()
        for i, row in zip(at, self._table.rows(slots[found]), strict=True):
            out[i] = row
        return out

    def columns_of(self, region_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per region of `region_ids`: whether the topic has its row, and the row's
        received time and prunable id (meaningless where it has none)."""
        slots = self._slots_of(region_ids)
        found = slots >= 0
        held = np.where(found, slots, 0)  # a table always has slot 0; masked out
        return found, self._table.received_at(held), self._table.prunable_at(held)

    def lowest_prunable(self, fresh_after: float) -> int | None:
        """The lowest prunable entry id of the topic's rows, or None when there are no
        rows or one was received before `fresh_after` (stale)."""
        members = self._members
        if not members:
            return None
        slots = np.fromiter(members.values(), np.intp, len(members))
        if self._table.received_at(slots).min() < fresh_after:
            return None
        return int(self._table.prunable_at(slots).min())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TopicRows({self.topic!r}, {len(self)} rows)"
