"""One topic's rows copied out of a `StatTable`, as of the copy (`TopicCopy`): what a purge
plans from (`RegionRegistry.topic_snapshot`), once per topic per round.

The copy takes a handful of C-level passes over the topic's rows and builds nothing per
row: the topic's member dict is copied whole (region id -> the table's slot), and the
columns are gathered in slot order. A slot of the table is found among the copied rows by
bisection. A copy that numbered its rows afresh would insert every region id into two new
dicts: at a million rows in 64 topics that was 0.55 s of a purge round, measured in process,
and a new leader's first round runs while the first reports still arrive.
"""

from __future__ import annotations

import numpy as np

from metasrv.leader._stat_columns import VALUE_COLUMNS, StatColumns
from metasrv.leader._stat_rows import StatRow
from metasrv.leader._topic_rows import TopicRows


class TopicCopy(StatColumns):
    """The rows of one topic, copied: read through `TopicRows` (`topic_rows`), by the slots
    they had in the table they came from. Later writes to that table do not show."""

    def __init__(self, topic: str, members: dict[int, int], table: StatColumns) -> None:
        held = np.sort(np.fromiter(members.values(), np.intp, len(members)))
        super().__init__(max(len(held), 1))  # slot 0 exists (`TopicRows.columns_of`)
        for name in ("_ids", *VALUE_COLUMNS):
            getattr(self, name)[: len(held)] = getattr(table, name)[held]
        self._topic[: len(held)] = self._topics.code_of(topic)
        self._end = len(held)
        self._held = held
        """The table's slots of the copied rows, ascending: row i was in `held[i]`."""
        self._name = topic
        self._members = members.copy()
        """Region id -> the table's slot (a dict copy: no insert per region)."""

    def members(self, topic: str) -> dict[int, int]:
        """Region id -> the table's slot of the copied rows naming `topic`."""
        return self._members if topic == self._name else {}

    def topic_rows(self, topic: str) -> TopicRows:
        """The copied rows naming `topic` as a read-only mapping (empty for another)."""
        return TopicRows(self, topic)

    def _local(self, slots: np.ndarray) -> np.ndarray:
        local: np.ndarray = np.searchsorted(self._held, slots)
        return local

    def row(self, slot: int) -> StatRow:
        return super().row(int(np.searchsorted(self._held, slot)))

    def rows(self, slots: np.ndarray) -> list[StatRow]:
        return super().rows(self._local(slots))

    def received_at(self, slots: np.ndarray) -> np.ndarray:
        return super().received_at(self._local(slots))

    def prunable_at(self, slots: np.ndarray) -> np.ndarray:
        return super().prunable_at(self._local(slots))
