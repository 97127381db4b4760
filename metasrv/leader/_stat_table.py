"""The registry's region rows, stored as columns (numpy arrays indexed by slot).

A heartbeat of a thousand regions is a handful of whole-column operations: look the
slots up (one C-level dict pass, or none: `SlotMemo`), judge the reported values against
the stored ones (`StatTable.judge`) and assign them in place (`StatTable.assign`). No
object is built per region on that path, and nothing here is tracked by the garbage
collector. The columns are the table's own: readers and writers go through operations
that say what they do to rows, `StatRow`s are built only when read (`_stat_rows.py`),
every row names one topic (`_topic_index.py`), and `TopicRows` is one topic's rows as a
read-only mapping (`_topic_rows.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise, repeat
from operator import attrgetter
from typing import Final

import numpy as np

from metasrv.leader._slot_memo import SlotMemo
from metasrv.leader._stat_rows import RowColumns, RowValues, StatRow, nullable, or_null
from metasrv.leader._topic_index import TopicIndex
from metasrv.leader._topic_rows import TopicRows
from metasrv.model import NULL

_INITIAL_CAPACITY: Final = 1024


def regresses(old: StatRow, flushed: int, manifest: int | None) -> bool:
    """A report of `flushed`/`manifest` would move the stored row backwards
    (`stat_regressed`): a lower flushed id at the same or a newer manifest version. A
    lower manifest version than the stored one means the region was re-created, and its
    lower flushed id is the truth. `StatTable.judge` applies the same rule a column at a
    time."""
    if flushed >= old.flushed_entry_id:
        return False
    old_manifest = old.manifest_version
    return manifest is None or old_manifest is None or manifest >= old_manifest


_VALUE_COLUMNS: Final = (
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

_TOPIC_OF: Final = attrgetter("topic")
_NODE_OF: Final = attrgetter("node_id")
_FLUSHED_OF: Final = attrgetter("flushed_entry_id")
_LATEST_OF: Final = attrgetter("topic_latest_entry_id")
_MEMTABLE_OF: Final = attrgetter("memtable_bytes")
_MANIFEST_OF: Final = attrgetter("manifest_version")
_RECEIVED_OF: Final = attrgetter("received_at")
_PRUNABLE_OF: Final = attrgetter("prunable_entry_id")


class StatTable:
    """Region rows as columns; see the module docstring.

    A slot (`lookup`) is a row's place in the columns: valid until the row is discarded,
    and what the batch operations (`judge`, `checkpoint_changed`, `assign`) take.
    """

    def __init__(self, capacity: int = _INITIAL_CAPACITY) -> None:
        self._slot: dict[int, int] = {}
        """Region id -> slot."""
        self._topics = TopicIndex()
        self._free: list[int] = []
        self._discards = 0
        """Rows discarded so far: a slot `remember`ed before a discard may be reused."""
        self._memo = SlotMemo()
        self._end = 0
        """Slots below this have been used; the free ones are in `_free`."""
        self._ids = np.zeros(capacity, np.int64)
        self._topic = np.full(capacity, -1, np.int32)
        """Topic code (`TopicIndex.code_of`), -1 for a free slot."""
        self._node = np.zeros(capacity, np.int64)
        self._flushed = np.zeros(capacity, np.int64)
        self._latest = np.full(capacity, NULL, np.int64)
        self._memtable = np.zeros(capacity, np.int64)
        self._manifest = np.full(capacity, NULL, np.int64)
        self._prunable = np.zeros(capacity, np.int64)
        self._received = np.zeros(capacity, np.float64)

    # --- reading ---------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Topics with at least one row."""
        return self._topics.topics()

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, region_id: object) -> bool:
        return region_id in self._slot

    @property
    def capacity(self) -> int:
        """Rows the columns hold before they grow (`reserve`)."""
        return len(self._ids)

    def get(self, region_id: int) -> StatRow | None:
        """The region's row, or None when it has none."""
        slot = self._slot.get(region_id)
        return None if slot is None else self.row(slot)

    def lookup(self, region_ids: list[int]) -> np.ndarray:
        """Each region's slot, -1 for a region without a row (one C-level pass)."""
        return np.fromiter(map(self._slot.get, region_ids, repeat(-1)), np.intp, len(region_ids))

    def recall(self, key: int, region_ids: np.ndarray) -> np.ndarray | None:
        """The slots `remember`ed under `key` if `region_ids` are the same ids in the same
        order and no row was discarded since; else None (`SlotMemo`)."""
        return self._memo.recall(key, region_ids, self._discards)

    def remember(self, key: int, region_ids: np.ndarray, slots: np.ndarray) -> None:
        """Keep `slots` (every one holding a row) of distinct `region_ids` for `recall`."""
        self._memo.remember(key, region_ids, slots, self._discards, len(self._slot))

    def judge(
        self,
        slots: np.ndarray,
        topic_names: Sequence[str],
        topics: np.ndarray,
        flushed: np.ndarray,
        manifest: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reported values against the stored rows, a column at a time, per slot of
        `slots` (-1: no row): (the row names the reported topic `topic_names[topics]`
        and the report moves it forward, the row names it and the report `regresses`).
        `manifest` None: every reported manifest version is null."""
        found = slots >= 0
        held = np.where(found, slots, 0)  # slot 0 stands in for the others; masked out
        named = found & (self._topic[held] == self._topics.codes_of(topic_names)[topics])
        regressed = named & (flushed < self._flushed[held])
        if regressed.any() and manifest is not None:
            old_manifest = self._manifest[held]
            recreated = (manifest != NULL) & (old_manifest != NULL) & (manifest < old_manifest)
            regressed &= ~recreated
        return named & ~regressed, regressed

    def checkpoint_changed(
        self, slots: np.ndarray, node_id: int, prunable: np.ndarray
    ) -> np.ndarray:
        """Per slot (each holding a row): whether the values a region checkpoint holds,
        the prunable id and the node, differ from the stored ones."""
        changed: np.ndarray = (self._prunable[slots] != prunable) | (self._node[slots] != node_id)
        return changed

    def checkpoints(self, region_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """`region_id -> (node_id, prunable_entry_id)` for those of `region_ids` that have
        a row, read a column at a time (no row is built)."""
        ids = list(region_ids)
        slots = self.lookup(ids)
        found = slots >= 0
        if not found.all():
            ids = [rid for rid, ok in zip(ids, found.tolist(), strict=True) if ok]
            slots = slots[found]
        pairs = zip(self._node[slots].tolist(), self._prunable[slots].tolist(), strict=True)
        return dict(zip(ids, pairs, strict=True))

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

    def topic_rows(self, topic: str) -> TopicRows:
        """The live rows naming `topic` (empty when none)."""
        return TopicRows(self, topic)

    def members(self, topic: str) -> dict[int, int]:
        """Region id -> slot of the rows naming `topic` (live: do not modify)."""
        return self._topics.members(topic)

    # --- writing ---------------------------------------------------------------------

    def assign(self, slots: np.ndarray, node_id: int, values: RowValues, received: float) -> None:
        """Overwrite rows in place (the heartbeat's steady state): every slot holds the
        row of the region `values` has at its place, which keeps its topic."""
        self._write(
            slots,
            node_id,
            values.flushed,
            values.latest,
            values.memtable,
            values.manifest,
            received,
            values.prunable,
        )

    def put(self, region_id: int, row: StatRow) -> None:
        """Store one row as the region's, moving it to the row's topic if it named
        another. Not the hot path (new regions, tests, the per-region heartbeat path)."""
        topic = row.topic
        slot = self._slot.get(region_id)
        if slot is None:
            slot = self._allocate(region_id)
            self._topics.join(topic, (region_id,), (slot,))
        else:
            old = self._topics.names[self._topic[slot]]
            if old != topic:
                self._topics.leave(old, region_id)
                self._topics.join(topic, (region_id,), (slot,))
        self._topic[slot] = self._topics.code_of(topic)
        self._node[slot] = row.node_id
        self._flushed[slot] = row.flushed_entry_id
        latest = row.topic_latest_entry_id
        self._latest[slot] = NULL if latest is None else latest
        self._memtable[slot] = row.memtable_bytes
        manifest = row.manifest_version
        self._manifest[slot] = NULL if manifest is None else manifest
        self._received[slot] = row.received_at
        self._prunable[slot] = row.prunable_entry_id

    def put_many(self, region_ids: list[int], rows: list[StatRow]) -> None:
        """`put` for many rows at once, new regions a column at a time."""
        found = self.lookup(region_ids)
        fresh = found < 0
        if not fresh.all():
            for i in np.flatnonzero(~fresh).tolist():
                self.put(region_ids[i], rows[i])
            keep = np.flatnonzero(fresh).tolist()
            region_ids = [region_ids[i] for i in keep]
            rows = [rows[i] for i in keep]
        if not region_ids:
            return
        topics = list(map(_TOPIC_OF, rows))
        codes = {topic: self._topics.code_of(topic) for topic in dict.fromkeys(topics)}
        self._insert(
            region_ids,
            np.fromiter(map(codes.__getitem__, topics), np.int32, len(topics)),
            np.array(list(map(_NODE_OF, rows)), np.int64),
            np.array(list(map(_FLUSHED_OF, rows)), np.int64),
            np.array(or_null(list(map(_LATEST_OF, rows))), np.int64),
            np.array(list(map(_MEMTABLE_OF, rows)), np.int64),
            np.array(or_null(list(map(_MANIFEST_OF, rows))), np.int64),
            np.array(list(map(_RECEIVED_OF, rows)), np.float64),
            np.array(list(map(_PRUNABLE_OF, rows)), np.int64),
        )

    def insert(
        self,
        values: RowValues,
        topic_names: Sequence[str],
        topics: np.ndarray,
        node_id: int,
        received: float,
    ) -> None:
        """Rows for distinct regions that have none (the caller checked), a column at a
        time: a datanode's first heartbeat, or every region's first report to a new
        leader. Region `values.ids[i]` names topic `topic_names[topics[i]]`."""
        if not len(values):
            return
        lut = np.full(len(topic_names), -1, np.int32)
        for i in np.unique(topics).tolist():
            lut[i] = self._topics.code_of(topic_names[i])
        self._insert(
            values.ids.tolist(),
            lut[topics],
            node_id,
            values.flushed,
            values.latest,
            values.memtable,
            values.manifest,
            received,
            values.prunable,
        )

    def _insert(
        self,
        region_ids: list[int],
        topics: np.ndarray,
        *values: int | float | np.ndarray,
    ) -> None:
        """Rows for distinct regions without one; `topics` are codes (`TopicIndex`),
        `values` the value columns (`_VALUE_COLUMNS`, in that order)."""
        n = len(region_ids)
        if n == 0:
            return
        slots = self._free[-n:][::-1]
        del self._free[len(self._free) - len(slots) :]
        more = n - len(slots)
        if more:
            if self._end + more > len(self._ids):
                self._grow(max(2 * len(self._ids), self._end + more))
            slots += range(self._end, self._end + more)
            self._end += more
        self._slot.update(zip(region_ids, slots, strict=True))
        at = np.array(slots, np.intp)
        # Membership by topic: one dict update per run of a topic.
        order = np.argsort(topics, kind="stable")
        codes = topics[order]
        ids_by_topic = np.asarray(region_ids, np.int64)[order].tolist()
        slots_by_topic = at[order].tolist()
        cuts = [0, *(np.flatnonzero(np.diff(codes)) + 1).tolist(), n]
        names = self._topics.names
        for start, stop in pairwise(cuts):
            topic = names[int(codes[start])]
            self._topics.join(topic, ids_by_topic[start:stop], slots_by_topic[start:stop])
        self._ids[at] = region_ids
        self._topic[at] = topics
        self._write(at, *values)

    def _write(self, slots: np.ndarray, *values: int | float | np.ndarray) -> None:
        """Set the value columns (`_VALUE_COLUMNS`, in that order) of `slots`."""
        for name, column in zip(_VALUE_COLUMNS, values, strict=True):
            getattr(self, name)[slots] = column

    def discard(self, region_id: int) -> None:
        """Forget a region's row (no-op when it has none)."""
        slot = self._slot.pop(region_id, None)
        if slot is None:
            return
        self._topics.leave(self._topics.names[self._topic[slot]], region_id)
        self._topic[slot] = -1
        self._free.append(slot)
        self._discards += 1

    def _allocate(self, region_id: int) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            if self._end == len(self._ids):
                self._grow(2 * len(self._ids))
            slot = self._end
            self._end += 1
        self._slot[region_id] = slot
        self._ids[slot] = region_id
        return slot

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` rows now (a new leader, before the first reports of
        every mapped region: growing then would copy every column while they arrive)."""
        if capacity > len(self._ids):
            self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        for name, fill in (
            ("_ids", 0),
            ("_topic", -1),
            ("_node", 0),
            ("_flushed", 0),
            ("_latest", NULL),
            ("_memtable", 0),
            ("_manifest", NULL),
            ("_prunable", 0),
            ("_received", 0),
        ):
            old: np.ndarray = getattr(self, name)
            new = np.full(capacity, fill, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    # --- copies ----------------------------------------------------------------------

    def copy(self, topics: Iterable[str] | None = None) -> StatTable:
        """A table of its own holding the rows of `topics` (all rows when None), as of now."""
        index = self._topics
        names = index.topics() if topics is None else [t for t in topics if t in index]
        slots = [np.fromiter(index.members(t).values(), np.intp) for t in names]
        taken = np.concatenate(slots) if slots else np.zeros(0, np.intp)
        out = StatTable(max(len(taken), 1))
        n = len(taken)
        for name in ("_ids", *_VALUE_COLUMNS):
            getattr(out, name)[:n] = getattr(self, name)[taken]
        start = 0
        for topic, topic_slots in zip(names, slots, strict=True):
            end = start + len(topic_slots)
            out._topic[start:end] = out._topics.code_of(topic)
            ids = out._ids[start:end].tolist()
            out._topics.join(topic, ids, range(start, end))
            out._slot.update(zip(ids, range(start, end), strict=True))
            start = end
        out._end = n
        return out
