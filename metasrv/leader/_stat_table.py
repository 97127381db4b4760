"""The registry's region rows, stored as columns (numpy arrays indexed by slot).

A heartbeat of a thousand regions is a handful of whole-column operations: look the
slots up (by bisection, a C-level dict pass, or not at all: `SlotMemo`), judge the
reported values against the stored ones (`StatTable.judge`) and assign them in place
(`StatTable.assign`). No object is built per region on that path, and nothing here is
tracked by the garbage collector. The columns (`_stat_columns.py`) are the table's own:
readers and writers go through operations that say what they do to rows, `StatRow`s are
built only when read (`_stat_rows.py`), every row names one topic (`_topic_index.py`),
and `TopicRows` is one topic's rows as a read-only mapping (`_topic_rows.py`).

A new leader's table is `prepare`d with a slot for every mapped region, before any
heartbeat: the index is built once, from the map, a C-level pass, so a region's first
report is a column operation like every later one (no insert into a million-entry
dict per region while the first round of a million reports arrives). A prepared row is
not a row until its region reports: it is in no topic's members, not counted, not read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Final

import numpy as np

from metasrv.leader._slot_memo import SlotMemo
from metasrv.leader._stat_columns import INITIAL_CAPACITY, VALUE_COLUMNS, StatColumns
from metasrv.leader._stat_rows import RowValues, StatRow, or_null
from metasrv.leader._topic_copy import TopicCopy
from metasrv.leader._topic_rows import TopicRows
from metasrv.model import NULL


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


_TOPIC_OF: Final = attrgetter("topic")
_NODE_OF: Final = attrgetter("node_id")
_FLUSHED_OF: Final = attrgetter("flushed_entry_id")
_LATEST_OF: Final = attrgetter("topic_latest_entry_id")
_MEMTABLE_OF: Final = attrgetter("memtable_bytes")
_MANIFEST_OF: Final = attrgetter("manifest_version")
_RECEIVED_OF: Final = attrgetter("received_at")
_PRUNABLE_OF: Final = attrgetter("prunable_entry_id")


class StatTable(StatColumns):
    """Region rows as columns; see the module docstring.

    A slot (`lookup`) is a row's place in the columns: valid until the row is discarded,
    and what the batch operations (`judge`, `checkpoint_changed`, `assign`) take.
    """

    def __init__(self, capacity: int = INITIAL_CAPACITY) -> None:
        super().__init__(capacity)
        self._slot: dict[int, int] = {}
        """Region id -> slot."""
        self._free: list[int] = []
        self._discards = 0
        """Rows discarded so far: a slot `remember`ed before a discard may be reused."""
        self._memo = SlotMemo()
        self._prepared = 0
        """Slots prepared whose region has not reported (in `_slot`, not rows)."""
        self._sorted = (0, 0)
        """Slots `prepare` laid out in region id order (start, stop)."""

    # --- reading ---------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Topics with at least one row."""
        return self._topics.topics()

    def __len__(self) -> int:
        return len(self._slot) - self._prepared

    def __contains__(self, region_id: object) -> bool:
        slot = self._slot.get(region_id)  # type: ignore[call-overload]
        return slot is not None and self._topic[slot] >= 0

    def get(self, region_id: int) -> StatRow | None:
        """The region's row, or None when it has none."""
        slot = self._slot.get(region_id)
        return None if slot is None or self._topic[slot] < 0 else self.row(slot)

    def lookup(self, region_ids: list[int], as_array: np.ndarray | None = None) -> np.ndarray:
        """Each region's slot, -1 for a region without one (one C-level pass). A
        prepared slot (no row yet) is a slot: `judge` and `prepared_for` tell them apart.
        `as_array`: the same ids as an int64 array, when the caller has one.

        Regions `prepare`d are found by bisection in their sorted slots, a column at a
        time (a million-entry dict costs a cache miss or two per region); the others, and
        any whose slot has changed hands since, in the index."""
        start, stop = self._sorted
        if stop == start:
            return np.fromiter(
                map(self._slot.get, region_ids, repeat(-1)), np.intp, len(region_ids)
            )
        ids = np.array(region_ids, np.int64) if as_array is None else as_array
        at = np.minimum(np.searchsorted(self._ids[start:stop], ids) + start, stop - 1)
        # A slot in use whose region is the one sought is that region's slot.
        held = (self._ids[at] == ids) & ((self._topic[at] >= 0) | (self._expect[at] >= 0))
        slots = np.where(held, at, -1)
        missed = np.flatnonzero(~held).tolist()
        if missed:
            get = self._slot.get
            slots[missed] = [get(region_ids[i], -1) for i in missed]
        return slots

    def recall(self, key: int, region_ids: np.ndarray) -> np.ndarray | None:
        """The slots `remember`ed under `key` if `region_ids` are the same ids in the same
        order and no row was discarded since; else None (`SlotMemo`)."""
        return self._memo.recall(key, region_ids, self._discards, len(self._slot))

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
        `manifest` None: every reported manifest version is null. A prepared slot's
        row names no topic (`prepared_for`)."""
        found = slots >= 0
        held = np.where(found, slots, 0)  # slot 0 stands in for the others; masked out
        stored = self._topic[held]  # -1 for a prepared slot: no row yet
        named = found & (stored >= 0) & (stored == self._topics.codes_of(topic_names)[topics])
        regressed = named & (flushed < self._flushed[held])
        if regressed.any() and manifest is not None:
            old_manifest = self._manifest[held]
            recreated = (manifest != NULL) & (old_manifest != NULL) & (manifest < old_manifest)
            regressed &= ~recreated
        return named & ~regressed, regressed

    def prepared_for(
        self, slots: np.ndarray, topic_names: Sequence[str], topics: np.ndarray
    ) -> np.ndarray:
        """Per slot of `slots` (-1: none): whether it is prepared (`prepare`) for a region
        mapped to the reported topic `topic_names[topics]`."""
        held = np.where(slots >= 0, slots, 0)  # slot 0 stands in for the others; masked out
        expected: np.ndarray = (slots >= 0) & (
            self._expect[held] == self._topics.codes_of(topic_names)[topics]
        )
        expected &= self._expect[held] >= 0
        return expected

    def checkpoints(self, region_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """`region_id -> (node_id, prunable_entry_id)` for those of `region_ids` that have
        a row, read a column at a time (no row is built)."""
        ids = list(region_ids)
        slots = self.lookup(ids)
        found = slots >= 0
        found[found] = self._topic[slots[found]] >= 0
        if not found.all():
            ids = [rid for rid, ok in zip(ids, found.tolist(), strict=True) if ok]
            slots = slots[found]
        pairs = zip(self._node[slots].tolist(), self._prunable[slots].tolist(), strict=True)
        return dict(zip(ids, pairs, strict=True))

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
        elif self._topic[slot] < 0:  # prepared: its first row
            self._unprepare(np.array([slot], np.intp))
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
        if not region_ids:
            return  # most heartbeats: every region judged a column at a time
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
            None,
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
        slots: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows for distinct regions that have none (the caller checked), a column at a
        time: a datanode's first heartbeat, or every region's first report to a new
        leader. Region `values.ids[i]` names topic `topic_names[topics[i]]`; `slots`, when
        given, are the regions' prepared slots (`prepared_for`), -1 where none. Returns
        the rows' slots."""
        if not len(values):
            return np.zeros(0, np.intp)
        lut = self._topics.codes_of(topic_names)
        for i in np.unique(topics[lut[topics] < 0]).tolist():
            lut[i] = self._topics.code_of(topic_names[i])  # a topic no row named before
        if slots is not None:
            self._unprepare(slots[slots >= 0])
        return self._insert(
            values.ids,
            lut[topics],
            slots,
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
        region_ids: list[int] | np.ndarray,
        topics: np.ndarray,
        prepared: np.ndarray | None,
        *values: int | float | np.ndarray,
    ) -> np.ndarray:
        """Rows for distinct regions without one; `topics` are codes (`TopicIndex`),
        `prepared` the regions' prepared slots (-1: none; None: none has one), `values`
        the value columns (`VALUE_COLUMNS`, in that order). Returns their slots."""
        n = len(region_ids)
        if n == 0:
            return np.zeros(0, np.intp)
        ids = np.asarray(region_ids, np.int64)
        if prepared is not None and bool((prepared >= 0).all()):
            at = prepared  # the index and the id column hold them already (`prepare`)
        else:
            listed = region_ids if isinstance(region_ids, list) else ids.tolist()
            at = self._new_slots(listed, prepared)
            self._ids[at] = ids
        # Membership by topic: sorted into the topics' dicts by their next reader.
        self._topics.join_later(topics, ids, at)
        self._topic[at] = topics
        self._write(at, *values)
        return at

    def _new_slots(self, region_ids: list[int], prepared: np.ndarray | None) -> np.ndarray:
        """Slots for `region_ids` (their `prepared` ones where they have one, -1 where
        not), put in the index."""
        if prepared is not None:
            fresh = np.flatnonzero(prepared < 0).tolist()
            at = prepared.copy()
            at[fresh] = self._new_slots([region_ids[i] for i in fresh], None)
            return at
        n = len(region_ids)
        slots = self._free[-n:][::-1]
        del self._free[len(self._free) - len(slots) :]
        more = n - len(slots)
        if more:
            if self._end + more > len(self._ids):
                self._grow(max(2 * len(self._ids), self._end + more))
            slots += range(self._end, self._end + more)
            self._end += more
        self._slot.update(zip(region_ids, slots, strict=True))
        return np.array(slots, np.intp)

    def discard(self, region_id: int) -> None:
        """Forget a region's row (no-op when it has none)."""
        slot = self._slot.pop(region_id, None)
        if slot is None:
            return
        if self._topic[slot] >= 0:
            self._topics.leave(self._topics.names[self._topic[slot]], region_id)
        else:
            self._unprepare(np.array([slot], np.intp))
        self._clean(slot)
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

    def prepare(self, topic_regions: Iterable[tuple[str, Iterable[int]]]) -> int:
        """A slot for each (topic, its region ids) region that has none, before it
        reports (a new leader, from the map); return the slots prepared. Regions must be
        distinct."""
        columns: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        nodes: list[np.ndarray] = []  # given routes, their datanodes (`SlotMemo.expect`)
        for topic, regions in topic_regions:
            column = np.fromiter(regions, np.int64)
            columns.append(column)
            codes.append(np.full(len(column), self._topics.code_of(topic), np.int32))
            if isinstance(regions, Mapping):
                nodes.append(np.fromiter(map(_NODE_OF, regions.values()), np.int64, len(column)))
        if not columns:
            return 0
        # New slots in region id order, so `lookup` can find them by bisection.
        ids = np.concatenate(columns)
        order = np.argsort(ids, kind="stable")
        ids, expect = ids[order], np.concatenate(codes)[order]
        node = np.concatenate(nodes)[order] if len(nodes) == len(columns) else None
        if self._slot:
            # Those with a slot already (a warm follower's table at take-over) are found a
            # column at a time, not by a million dict probes; no datanode's list is whole.
            new = ~self._has_slot(ids)
            ids, expect, node = ids[new], expect[new], None
        n = len(ids)
        if not n:
            return 0
        start, stop = self._end, self._end + n
        if stop > len(self._ids):
            self._grow(stop)
        self._end = stop
        self._slot.update(zip(ids.tolist(), range(start, stop), strict=True))
        self._ids[start:stop] = ids
        self._expect[start:stop] = expect
        if n > self._sorted[1] - self._sorted[0]:  # a later, smaller prepare: the index
            self._sorted = (start, stop)
        self._prepared += n
        if node is not None:
            self._memo.expect(node, ids, np.arange(start, stop), self._discards)
        return n

    def _has_slot(self, ids: np.ndarray) -> np.ndarray:
        """Per region of sorted, distinct `ids`: whether it has a slot (a row or a
        prepared one); by bisection in the prepared slots, the index for the others."""
        start, stop = self._sorted
        found = np.zeros(len(ids), bool)
        if stop > start:
            at = np.minimum(np.searchsorted(self._ids[start:stop], ids) + start, stop - 1)
            found = (self._ids[at] == ids) & ((self._topic[at] >= 0) | (self._expect[at] >= 0))
        missed = np.flatnonzero(~found)
        if len(missed) and len(self._slot) > int(found.sum()):
            index = self._slot
            found[missed] = [rid in index for rid in ids[missed].tolist()]
        return found

    def _unprepare(self, slots: np.ndarray) -> None:
        """Prepared `slots` now hold rows (or were discarded)."""
        self._expect[slots] = -1
        self._prepared -= len(slots)

    # --- copies ----------------------------------------------------------------------

    def snapshot(self, topic: str) -> TopicRows:
        """The rows naming `topic`, copied as of now (`TopicCopy`: a purge plans from it)."""
        return TopicCopy(topic, self._topics.members(topic), self).topic_rows(topic)

    def copy(self, topics: Iterable[str] | None = None) -> StatTable:
        """A table of its own holding the rows of `topics` (all rows when None), as of now."""
        index = self._topics
        names = index.topics() if topics is None else [t for t in topics if t in index]
        slots = [np.fromiter(index.members(t).values(), np.intp) for t in names]
        taken = np.concatenate(slots) if slots else np.zeros(0, np.intp)
        out = StatTable(max(len(taken), 1))
        n = len(taken)
        for name in ("_ids", *VALUE_COLUMNS):
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
