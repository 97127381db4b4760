"""The registry's region rows, stored as columns (numpy arrays indexed by slot).

A heartbeat of a thousand regions used to rebuild a thousand row objects and replace
them in dicts: most of the leader's CPU per region stat went to allocating, freeing and
finding those objects in memory. Here a region is a slot, each field a column, and a
heartbeat whose regions all have rows is a handful of whole-column operations: look the
slots up (one C-level dict pass), compare, and assign (`StatTable.assign`). No object is
built per region on that path, and nothing here is tracked by the garbage collector
(dicts of ints and arrays of numbers).

`StatRow` objects are built only when read (`row`, `TopicRows`), for the readers that
take a region at a time. A null `topic_latest_entry_id` or `manifest_version` is stored
as `NULL` (-2**63, outside every id's range).

Membership: every row belongs to one topic, and `TopicRows` is the live read-only view
of one topic's rows as `region id -> StatRow`, which is what the planner, the stat
history and the heartbeat's per-region path read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from itertools import pairwise, repeat
from operator import attrgetter
from typing import Any, Final, overload

import msgspec
import numpy as np

NULL: Final = -(2**63)
"""Stored for a null `topic_latest_entry_id` or `manifest_version`."""

_INITIAL_CAPACITY: Final = 1024


class StatRow(msgspec.Struct, frozen=True, gc=False):
    """One region's stat as read from the table (a `RegionStat` without its region id,
    which is the key it is stored under). The prunable entry id is stored precomputed
    (`metasrv.model.prunable_entry_id`)."""

    node_id: int
    topic: str
    flushed_entry_id: int
    topic_latest_entry_id: int | None
    memtable_bytes: int
    manifest_version: int | None
    received_at: float
    prunable_entry_id: int


_VALUE_COLUMNS: Final = (
    "node",
    "flushed",
    "latest",
    "memtable",
    "manifest",
    "received",
    "prunable",
)
"""The columns a row's values live in (beside `ids` and `topic`), in the order `assign`
and `insert` take them."""

_TOPIC_OF: Final = attrgetter("topic")
_NODE_OF: Final = attrgetter("node_id")
_FLUSHED_OF: Final = attrgetter("flushed_entry_id")
_LATEST_OF: Final = attrgetter("topic_latest_entry_id")
_MEMTABLE_OF: Final = attrgetter("memtable_bytes")
_MANIFEST_OF: Final = attrgetter("manifest_version")
_RECEIVED_OF: Final = attrgetter("received_at")
_PRUNABLE_OF: Final = attrgetter("prunable_entry_id")


def _or_null(values: list[int | None]) -> list[int]:
    if None in values:
        return [NULL if v is None else v for v in values]
    return values  # type: ignore[return-value]  # no None: checked above


def _nullable(values: np.ndarray) -> list[int | None]:
    out: list[int | None] = values.tolist()
    if len(values) and (values == NULL).any():
        out = [None if v == NULL else v for v in out]
    return out


@dataclass(frozen=True, slots=True)
class RowColumns:
    """Copies of some rows' columns (`StatTable.columns`); `topic` indexes `names`."""

    names: list[str]
    ids: np.ndarray
    topic: np.ndarray
    node: np.ndarray
    flushed: np.ndarray
    latest: np.ndarray
    memtable: np.ndarray
    manifest: np.ndarray
    received: np.ndarray
    prunable: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def where(self, mask: np.ndarray) -> RowColumns:
        """The rows where `mask` is true."""
        return RowColumns(
            self.names,
            self.ids[mask],
            self.topic[mask],
            self.node[mask],
            self.flushed[mask],
            self.latest[mask],
            self.memtable[mask],
            self.manifest[mask],
            self.received[mask],
            self.prunable[mask],
        )


class StatTable:
    """Region rows as columns; see the module docstring."""

    def __init__(self, capacity: int = _INITIAL_CAPACITY) -> None:
        self._slot: dict[int, int] = {}
        """Region id -> slot."""
        self._members: dict[str, dict[int, int]] = {}
        """Topic -> {region id -> slot} of the rows naming it."""
        self._codes: dict[str, int] = {}
        self._names: list[str] = []
        self._free: list[int] = []
        self._discards = 0
        """Rows discarded so far: a slot `remember`ed before a discard may be reused."""
        self._recent: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        """Key (a datanode) -> (discards then, its region ids, their slots): `recall`."""
        self._remembered = 0
        """Region ids held in `_recent` (16 bytes each with their slots)."""
        self._end = 0
        """Slots below this have been used; the free ones are in `_free`."""
        self.ids = np.zeros(capacity, np.int64)
        self.topic = np.full(capacity, -1, np.int32)
        """Topic code (`code_of`), -1 for a free slot."""
        self.node = np.zeros(capacity, np.int64)
        self.flushed = np.zeros(capacity, np.int64)
        self.latest = np.full(capacity, NULL, np.int64)
        self.memtable = np.zeros(capacity, np.int64)
        self.manifest = np.full(capacity, NULL, np.int64)
        self.prunable = np.zeros(capacity, np.int64)
        self.received = np.zeros(capacity, np.float64)

    # --- topics ----------------------------------------------------------------------

    def code_of(self, topic: str) -> int:
        """The topic's code in the `topic` column (assigned on first use)."""
        code = self._codes.get(topic)
        if code is None:
            code = self._codes[topic] = len(self._names)
            self._names.append(topic)
        return code

    def codes(self, topics: Iterable[str]) -> np.ndarray:
        """Each topic's code, -1 for a topic no row has ever named."""
        return np.fromiter(map(self._codes.get, topics, repeat(-1)), np.int32)

    def topics(self) -> list[str]:
        """Topics with at least one row."""
        return list(self._members)

    # --- reading ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, region_id: object) -> bool:
        return region_id in self._slot

    def slot_of(self, region_id: int) -> int | None:
        return self._slot.get(region_id)

    def lookup(self, region_ids: list[int]) -> np.ndarray:
        """Each region's slot, -1 for a region without a row (one C-level pass)."""
        return np.fromiter(map(self._slot.get, region_ids, repeat(-1)), np.intp, len(region_ids))

    def recall(self, key: int, region_ids: np.ndarray) -> np.ndarray | None:
        """The slots `remember`ed under `key` if `region_ids` are the same ids in the same
        order and no row was discarded since; else None.

        A datanode reports the same regions in the same order heartbeat after
        heartbeat, so comparing two arrays replaces a dict lookup per region (a cache
        miss each, at a million regions)."""
        kept = self._recent.get(key)
        if kept is None or kept[0] != self._discards or not np.array_equal(kept[1], region_ids):
            return None
        return kept[2]

    def remember(self, key: int, region_ids: np.ndarray, slots: np.ndarray) -> None:
        """Keep `slots` (every one holding a row) of distinct `region_ids` for `recall`."""
        recent = self._recent
        old = recent.pop(key, None)
        if old is not None:
            self._remembered -= len(old[1])
        # At most twice as many regions as there are rows (a datanode's list, and one
        # more for each region that moved between datanodes), oldest dropped first: a
        # flood of invented datanode ids cannot grow it further.
        bound = 2 * len(self._slot)
        while recent and self._remembered + len(region_ids) > bound:
            self._remembered -= len(recent.pop(next(iter(recent)))[1])
        recent[key] = (self._discards, region_ids.copy(), slots)
        self._remembered += len(region_ids)

    def row(self, slot: int) -> StatRow:
        """The row stored in `slot`."""
        latest = int(self.latest[slot])
        manifest = int(self.manifest[slot])
        return StatRow(
            int(self.node[slot]),
            self._names[self.topic[slot]],
            int(self.flushed[slot]),
            None if latest == NULL else latest,
            int(self.memtable[slot]),
            None if manifest == NULL else manifest,
            float(self.received[slot]),
            int(self.prunable[slot]),
        )

    def rows(self, slots: np.ndarray) -> list[StatRow]:
        """The rows in `slots`, in order, a column at a time."""
        if not len(slots):
            return []
        names = self._names
        return list(
            map(
                StatRow,
                self.node[slots].tolist(),
                [names[c] for c in self.topic[slots].tolist()],
                self.flushed[slots].tolist(),
                _nullable(self.latest[slots]),
                self.memtable[slots].tolist(),
                _nullable(self.manifest[slots]),
                self.received[slots].tolist(),
                self.prunable[slots].tolist(),
            )
        )

    @property
    def end(self) -> int:
        """Every row's slot is below this."""
        return self._end

    def columns(self, start: int = 0, stop: int | None = None) -> RowColumns:
        """Copies of the rows in slots `start` to `stop` (to `end` when None), as of now."""
        stop = self._end if stop is None else min(stop, self._end)
        used = np.flatnonzero(self.topic[start:stop] >= 0) + start
        return RowColumns(
            list(self._names),
            self.ids[used],
            self.topic[used],
            self.node[used],
            self.flushed[used],
            self.latest[used],
            self.memtable[used],
            self.manifest[used],
            self.received[used],
            self.prunable[used],
        )

    def topic_rows(self, topic: str) -> TopicRows:
        """The live rows naming `topic` (empty when none)."""
        return TopicRows(self, topic)

    def members(self, topic: str) -> dict[int, int]:
        """Region id -> slot of the rows naming `topic` (live: do not modify)."""
        return self._members.get(topic, _NO_MEMBERS)

    # --- writing ---------------------------------------------------------------------

    def assign(
        self,
        slots: np.ndarray,
        node_id: int,
        flushed: np.ndarray,
        latest: np.ndarray,
        memtable: np.ndarray,
        manifest: np.ndarray,
        received: float,
        prunable: np.ndarray,
    ) -> None:
        """Overwrite rows in place (the heartbeat's steady state): every slot holds a
        row already and keeps its region and topic."""
        self._write(slots, node_id, flushed, latest, memtable, manifest, received, prunable)

    def put(self, region_id: int, row: StatRow) -> None:
        """Store one row as the region's, moving it to the row's topic if it named
        another. Not the hot path (new regions, tests, the per-region heartbeat path)."""
        topic = row.topic
        slot = self._slot.get(region_id)
        if slot is None:
            slot = self._allocate(region_id)
            self._members.setdefault(topic, {})[region_id] = slot
        else:
            old = self._names[self.topic[slot]]
            if old != topic:
                self._leave(old, region_id)
                self._members.setdefault(topic, {})[region_id] = slot
        self.topic[slot] = self.code_of(topic)
        self.node[slot] = row.node_id
        self.flushed[slot] = row.flushed_entry_id
        latest = row.topic_latest_entry_id
        self.latest[slot] = NULL if latest is None else latest
        self.memtable[slot] = row.memtable_bytes
        manifest = row.manifest_version
        self.manifest[slot] = NULL if manifest is None else manifest
        self.received[slot] = row.received_at
        self.prunable[slot] = row.prunable_entry_id

    def put_many(self, region_ids: list[int], rows: list[StatRow]) -> None:
        """`put` for many rows at once, new regions a column at a time (`insert`)."""
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
        for topic in dict.fromkeys(topics):
            self.code_of(topic)
        self.insert(
            region_ids,
            np.fromiter(map(self._codes.__getitem__, topics), np.int32, len(topics)),
            np.array(list(map(_NODE_OF, rows)), np.int64),
            np.array(list(map(_FLUSHED_OF, rows)), np.int64),
            np.array(_or_null(list(map(_LATEST_OF, rows))), np.int64),
            np.array(list(map(_MEMTABLE_OF, rows)), np.int64),
            np.array(_or_null(list(map(_MANIFEST_OF, rows))), np.int64),
            np.array(list(map(_RECEIVED_OF, rows)), np.float64),
            np.array(list(map(_PRUNABLE_OF, rows)), np.int64),
        )

    def insert(
        self,
        region_ids: list[int],
        topics: np.ndarray,
        node: int | np.ndarray,
        flushed: np.ndarray,
        latest: np.ndarray,
        memtable: np.ndarray,
        manifest: np.ndarray,
        received: float | np.ndarray,
        prunable: np.ndarray,
    ) -> None:
        """Rows for distinct regions that have none (the caller checked), a column at a
        time: a datanode's first heartbeat, or every region's first report to a new
        leader. `topics` are codes (`code_of`)."""
        n = len(region_ids)
        if n == 0:
            return
        slots = self._free[-n:][::-1]
        del self._free[len(self._free) - len(slots) :]
        more = n - len(slots)
        if more:
            if self._end + more > len(self.ids):
                self._grow(max(2 * len(self.ids), self._end + more))
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
        for start, stop in pairwise(cuts):
            members = self._members.setdefault(self._names[int(codes[start])], {})
            members.update(zip(ids_by_topic[start:stop], slots_by_topic[start:stop], strict=True))
        self.ids[at] = region_ids
        self.topic[at] = topics
        self._write(at, node, flushed, latest, memtable, manifest, received, prunable)

    def _write(self, slots: np.ndarray, *values: int | float | np.ndarray) -> None:
        """Set the value columns (`_VALUE_COLUMNS`, in that order) of `slots`."""
        for name, column in zip(_VALUE_COLUMNS, values, strict=True):
            getattr(self, name)[slots] = column

    def discard(self, region_id: int) -> None:
        """Forget a region's row (no-op when it has none)."""
        slot = self._slot.pop(region_id, None)
        if slot is None:
            return
        self._leave(self._names[self.topic[slot]], region_id)
        self.topic[slot] = -1
        self._free.append(slot)
        self._discards += 1

    def _leave(self, topic: str, region_id: int) -> None:
        members = self._members.get(topic)
        if members is not None:
            members.pop(region_id, None)
            if not members:
                del self._members[topic]

    def _allocate(self, region_id: int) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            if self._end == len(self.ids):
                self._grow(2 * len(self.ids))
            slot = self._end
            self._end += 1
        self._slot[region_id] = slot
        self.ids[slot] = region_id
        return slot

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` rows now (a new leader, before the first reports of
        every mapped region: growing then would copy every column while they arrive)."""
        if capacity > len(self.ids):
            self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        for name, fill in (
            ("ids", 0),
            ("topic", -1),
            ("node", 0),
            ("flushed", 0),
            ("latest", NULL),
            ("memtable", 0),
            ("manifest", NULL),
            ("prunable", 0),
            ("received", 0),
        ):
            old: np.ndarray = getattr(self, name)
            new = np.full(capacity, fill, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    # --- copies ----------------------------------------------------------------------

    def copy(self, topics: Iterable[str] | None = None) -> StatTable:
        """A table of its own holding the rows of `topics` (all rows when None), as of now."""
        names = list(self._members) if topics is None else [t for t in topics if t in self._members]
        slots = [np.fromiter(self._members[t].values(), np.intp) for t in names]
        taken = np.concatenate(slots) if slots else np.zeros(0, np.intp)
        out = StatTable(max(len(taken), 1))
        n = len(taken)
        for name in ("ids", *_VALUE_COLUMNS):
            getattr(out, name)[:n] = getattr(self, name)[taken]
        start = 0
        for topic, topic_slots in zip(names, slots, strict=True):
            end = start + len(topic_slots)
            out.topic[start:end] = out.code_of(topic)
            ids = out.ids[start:end].tolist()
            out._members[topic] = dict(zip(ids, range(start, end), strict=True))
            start = end
        for members in out._members.values():
            out._slot.update(members)
        out._end = n
        return out


_NO_MEMBERS: Final[dict[int, int]] = {}


class TopicRows(Mapping[int, StatRow]):
    """Live, read-only `region id -> StatRow` over one topic's rows in a `StatTable`.

    Rows are built on access; `keys()` is the table's own key view (so comparing it
    with another dict's keys is one C-level pass), and `lowest_prunable` answers the
    planner's question for the whole topic a column at a time.
    """

    __slots__ = ("_table", "topic")

    def __init__(self, table: StatTable, topic: str) -> None:
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
        return found, self._table.received[held], self._table.prunable[held]

    def lowest_prunable(self, fresh_after: float) -> int | None:
        """The lowest prunable entry id of the topic's rows, or None when there are no
        rows or one was received before `fresh_after` (stale)."""
        members = self._members
        if not members:
            return None
        slots = np.fromiter(members.values(), np.intp, len(members))
        if self._table.received[slots].min() < fresh_after:
            return None
        return int(self._table.prunable[slots].min())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TopicRows({self.topic!r}, {len(self)} rows)"
