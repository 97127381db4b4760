"""The storage of a `StatTable`: one numpy array per column, indexed by slot
(`StatColumns`), which grow together; rows are read out of them a column at a time, and so
are the checkpoint's values compared and each row's dirty-checkpoint flag kept. Which
region is in which slot is the table's business (`_stat_table.py`)."""

from __future__ import annotations

from typing import Final

import numpy as np

from metasrv.leader._stat_rows import RowColumns, StatRow, nullable
from metasrv.leader._topic_index import TopicIndex
from metasrv.model import NULL

INITIAL_CAPACITY: Final = 1024

VALUE_COLUMNS: Final = (
    "_node",
    "_flushed",
    "_latest",
    "_memtable",
    "_manifest",
    "_received",
    "_prunable",
)
"""The columns a row's values live in (beside `_ids` and `_topic`), in the order
`_write` takes them."""


class StatColumns:
    """The columns of region rows, by slot; `_topic` is a row's topic code in `_topics`
    (-1 for a slot that holds no row)."""

    def __init__(self, capacity: int = INITIAL_CAPACITY) -> None:
        self._topics = TopicIndex()
        self._end = 0
        """Slots below this have been used."""
        self._ids = np.zeros(capacity, np.int64)
        self._topic = np.full(capacity, -1, np.int32)
        """Topic code (`TopicIndex.code_of`), -1 for a free or prepared slot."""
        self._expect = np.full(capacity, -1, np.int32)
        """A prepared slot's mapped topic code (`StatTable.prepare`), -1 for any other."""
        self._node = np.zeros(capacity, np.int64)
        self._flushed = np.zeros(capacity, np.int64)
        self._latest = np.full(capacity, NULL, np.int64)
        self._memtable = np.zeros(capacity, np.int64)
        self._manifest = np.full(capacity, NULL, np.int64)
        self._prunable = np.zeros(capacity, np.int64)
        self._received = np.zeros(capacity, np.float64)
        self._dirty = np.zeros(capacity, bool)
        """Rows whose checkpoint is to be written (`mark_dirty`)."""
        self._dirty_count = 0
        """Slots flagged in `_dirty`."""

    @property
    def capacity(self) -> int:
        """Rows the columns hold before they grow (`reserve`)."""
        return len(self._ids)

    def row(self, slot: int) -> StatRow:
        """The row stored in `slot`."""
        latest = int(self._latest[slot])
        manifest = int(self._manifest[slot])
        return StatRow(
            int(self._node[slot]),
            self._topics.names[self._topic[slot]],
            int(self._flushed[slot]),
            None if latest == NULL else latest,
            int(self._memtable[slot]),
            None if manifest == NULL else manifest,
            float(self._received[slot]),
            int(self._prunable[slot]),
        )

    def rows(self, slots: np.ndarray) -> list[StatRow]:
        """The rows in `slots`, in order, a column at a time."""
        if not len(slots):
            return []
        names = self._topics.names
        return list(
            map(
                StatRow,
                self._node[slots].tolist(),
                [names[c] for c in self._topic[slots].tolist()],
                self._flushed[slots].tolist(),
                nullable(self._latest[slots]),
                self._memtable[slots].tolist(),
                nullable(self._manifest[slots]),
                self._received[slots].tolist(),
                self._prunable[slots].tolist(),
            )
        )

    def received_at(self, slots: np.ndarray) -> np.ndarray:
        """The rows' receive times (monotonic clock), per slot."""
        received: np.ndarray = self._received[slots]
        return received

    def node_at(self, slots: np.ndarray) -> np.ndarray:
        """The datanodes the rows were reported by, per slot."""
        node: np.ndarray = self._node[slots]
        return node

    def prunable_at(self, slots: np.ndarray) -> np.ndarray:
        """The rows' prunable entry ids, per slot."""
        prunable: np.ndarray = self._prunable[slots]
        return prunable

    @property
    def end(self) -> int:
        """Every row's slot is below this."""
        return self._end

    def columns(self, start: int = 0, stop: int | None = None) -> RowColumns:
        """Copies of the rows in slots `start` to `stop` (to `end` when None), as of now."""
        stop = self._end if stop is None else min(stop, self._end)
        used = np.flatnonzero(self._topic[start:stop] >= 0) + start
        return RowColumns(
            list(self._topics.names),
            self._ids[used],
            self._topic[used],
            self._node[used],
            self._flushed[used],
            self._latest[used],
            self._memtable[used],
            self._manifest[used],
            self._received[used],
            self._prunable[used],
        )

    def checkpoint_changed(
        self, slots: np.ndarray, node_id: int, prunable: np.ndarray
    ) -> np.ndarray:
        """Per slot (each holding a row): whether the values a region checkpoint holds,
        the prunable id and the node, differ from the stored ones."""
        changed: np.ndarray = (self._prunable[slots] != prunable) | (self._node[slots] != node_id)
        return changed

    @property
    def dirty_count(self) -> int:
        """Rows flagged dirty (`mark_dirty`) since they were last taken."""
        return self._dirty_count

    def mark_dirty(self, slots: np.ndarray) -> int:
        """Flag the rows in distinct `slots` as having a checkpoint to write; return how
        many were not flagged yet. A flag per slot: however often a region changes
        between two flushes, it is held once."""
        fresh = int(np.count_nonzero(~self._dirty[slots]))
        self._dirty[slots] = True
        self._dirty_count += fresh
        return fresh

    def take_dirty(self) -> np.ndarray:
        """The region ids of the rows flagged dirty, in slot order; the flags are cleared."""
        slots = np.flatnonzero(self._dirty[: self._end])
        self._dirty[: self._end] = False  # every flag is taken: no scatter
        self._dirty_count = 0
        held: np.ndarray = self._ids[slots[self._topic[slots] >= 0]]
        return held

    def _clean(self, slot: int) -> None:
        """Drop the dirty flag of `slot` (its row is discarded)."""
        if self._dirty[slot]:
            self._dirty[slot] = False
            self._dirty_count -= 1

    def _write(self, slots: np.ndarray, *values: int | float | np.ndarray) -> None:
        """Set the value columns (`VALUE_COLUMNS`, in that order) of `slots`."""
        for name, column in zip(VALUE_COLUMNS, values, strict=True):
            getattr(self, name)[slots] = column

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` rows now (a new leader, before the first reports of
        every mapped region: growing then would copy every column while they arrive)."""
        if capacity > len(self._ids):
            self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        for name, fill in (
            ("_ids", 0),
            ("_topic", -1),
            ("_expect", -1),
            ("_node", 0),
            ("_flushed", 0),
            ("_latest", NULL),
            ("_memtable", 0),
            ("_manifest", NULL),
            ("_prunable", 0),
            ("_received", 0),
            ("_dirty", False),
        ):
            old: np.ndarray = getattr(self, name)
            new = np.full(capacity, fill, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
