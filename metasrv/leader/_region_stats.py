"""The leader's region stats: region -> row (`StatTable`), each row naming one topic
(topic -> regions, `TopicIndex`), read a topic at a time (`TopicRows`: live, or copied,
`TopicCopy`). What a row holds is declared once (`RowColumns`' fields, `SCHEMA`); the
table's storage, the `StatRow`s it reads out and its copies are derived from it.

The rows are stored as columns (numpy arrays indexed by slot; a slot is the table's own
business, never seen outside this module's classes and the heartbeat's judge). A
heartbeat of a thousand regions is a handful of whole-column operations: look the slots
up (by bisection, a C-level dict pass, or not at all: `SlotMemo`), judge the reported
values against the stored ones (`StatTable.judge`) and assign them in place
(`StatTable.assign`); any other write (first reports, moved regions, rows put by hand)
is `StatTable.store`. No object is built per region on that path, and nothing here is
tracked by the garbage collector.

A new leader's table is `prepare`d with a slot for every mapped region, before any
heartbeat: the index is built once, from the map, a C-level pass, so a region's first
report is a column operation like every later one (no insert into a million-entry
dict per region while the first round of a million reports arrives). A prepared row is
not a row until its region reports: it is in no topic's members, not counted, not read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, KeysView, Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from operator import attrgetter
from typing import Any, Final, Protocol, overload

import msgspec
import numpy as np

from metasrv.model import NULL


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


def _column(
    row: str, dtype: type[np.generic], fill: float = 0, *, nullable: bool = False
) -> dict[str, Any]:
    """A stored column (`Column`): the `StatRow` field it holds, its dtype, what a slot
    without a row holds, and whether a null is stored (as `NULL`)."""
    return {"row": row, "dtype": dtype, "fill": fill, "nullable": nullable}


@dataclass(frozen=True, slots=True)
class RowColumns:
    """Copies of some rows' columns (`StatTable.columns`): `topic` indexes `names`, a null
    is `NULL`. Its column fields are the declaration of what a row is stored as
    (`SCHEMA`): add a column here and the table stores, reads and copies it."""

    names: list[str]
    ids: np.ndarray
    node: np.ndarray = field(metadata=_column("node_id", np.int64))
    topic: np.ndarray = field(metadata=_column("topic", np.int32, -1))
    """The topic's code (`TopicIndex.code_of`); in the table, -1 for a slot without a row."""
    flushed: np.ndarray = field(metadata=_column("flushed_entry_id", np.int64))
    latest: np.ndarray = field(
        metadata=_column("topic_latest_entry_id", np.int64, NULL, nullable=True)
    )
    memtable: np.ndarray = field(metadata=_column("memtable_bytes", np.int64))
    manifest: np.ndarray = field(
        metadata=_column("manifest_version", np.int64, NULL, nullable=True)
    )
    received: np.ndarray = field(metadata=_column("received_at", np.float64))
    prunable: np.ndarray = field(metadata=_column("prunable_entry_id", np.int64))

    def __len__(self) -> int:
        return len(self.ids)

    def where(self, mask: np.ndarray) -> RowColumns:
        """The rows where `mask` is true."""
        taken = {c.name: getattr(self, c.name)[mask] for c in SCHEMA}
        return RowColumns(self.names, self.ids[mask], **taken)


@dataclass(frozen=True, slots=True)
class Column:
    """One stored column (`RowColumns`' fields)."""

    name: str
    row: str
    """The `StatRow` field it holds."""
    dtype: type[np.generic]
    fill: float
    """What a slot without a row holds."""
    nullable: bool
    """A null is stored as `NULL`."""


SCHEMA: Final = tuple(Column(f.name, **f.metadata) for f in fields(RowColumns) if f.metadata)
"""The stored columns, in `StatRow`'s field order."""
if tuple(c.row for c in SCHEMA) != StatRow.__struct_fields__:
    raise TypeError("RowColumns' columns must follow StatRow's fields, in order")


@dataclass(slots=True)
class RowValues:
    """New values of some regions' rows, a column each, in the same order: the columns
    a heartbeat reports (`SCHEMA` names); the reporting node and the receive time are
    the heartbeat's. `NULL` stands for a null."""

    ids: np.ndarray
    flushed: np.ndarray
    latest: np.ndarray
    memtable: np.ndarray
    manifest: np.ndarray
    prunable: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


REPORTED: Final = tuple(f.name for f in fields(RowValues) if f.name != "ids")
"""The columns a heartbeat sets (`RowValues`), beside the node and the receive time."""


def or_null(values: list[int | None]) -> list[int]:
    """`values` with None as `NULL` (the list itself when it holds no None)."""
    if None in values:
        return [NULL if v is None else v for v in values]
    return values  # type: ignore[return-value]  # no None: checked above


def nullable(values: np.ndarray) -> list[int | None]:
    """A column as a list, `NULL` as None."""
    out: list[int | None] = values.tolist()
    if len(values) and (values == NULL).any():
        out = [None if v == NULL else v for v in out]
    return out


def _new_columns(capacity: int) -> dict[str, np.ndarray]:
    return {c.name: np.full(capacity, c.fill, c.dtype) for c in SCHEMA}


def _rows(columns: Mapping[str, np.ndarray], names: list[str], at: np.ndarray) -> list[StatRow]:
    """The rows at positions `at` of `columns`, a column at a time; topic codes index
    `names`."""
    if not len(at):
        return []
    values: list[list[Any]] = []
    for c in SCHEMA:
        column = columns[c.name][at]
        if c.name == "topic":
            values.append([names[code] for code in column.tolist()])
        else:
            values.append(nullable(column) if c.nullable else column.tolist())
    return list(map(StatRow, *values))


def _row(columns: Mapping[str, np.ndarray], names: list[str], at: int) -> StatRow:
    """`_rows` of one position, read a value at a time (cheaper than a column pass)."""
    values: list[Any] = []
    for c in SCHEMA:
        value = columns[c.name][at].item()
        if c.name == "topic":
            value = names[value]
        elif c.nullable and value == NULL:
            value = None
        values.append(value)
    return StatRow(*values)


def _columns_of_rows(rows: list[StatRow]) -> dict[str, np.ndarray]:
    """Rows as columns, but for their topics (which the table turns into codes)."""
    columns: dict[str, np.ndarray] = {}
    for c in SCHEMA:
        if c.name != "topic":
            values = list(map(attrgetter(c.row), rows))
            columns[c.name] = np.array(or_null(values) if c.nullable else values, c.dtype)
    return columns


def regressed(
    old_flushed: np.ndarray,
    old_manifest: np.ndarray,
    flushed: np.ndarray,
    manifest: np.ndarray | None,
) -> np.ndarray:
    """Per region: a report of `flushed`/`manifest` would move the stored row backwards
    (`stat_regressed`): a lower flushed id at the same or a newer manifest version. A
    lower manifest version than the stored one means the region was re-created, and its
    lower flushed id is the truth. `NULL` (or `manifest` None) is a null version, which
    never proves a re-creation."""
    lower: np.ndarray = flushed < old_flushed
    if manifest is not None and lower.any():
        recreated = (manifest != NULL) & (old_manifest != NULL) & (manifest < old_manifest)
        lower &= ~recreated
    return lower


def regresses(old: StatRow, flushed: int, manifest: int | None) -> bool:
    """`regressed` for one stored row and one report."""
    old_manifest = NULL if old.manifest_version is None else old.manifest_version
    return bool(
        regressed(
            np.array([old.flushed_entry_id]),
            np.array([old_manifest]),
            np.array([flushed]),
            np.array([NULL if manifest is None else manifest]),
        )[0]
    )


# Which rows of a `StatTable` name which topic (`TopicIndex`): each topic's code, the value
# the table's topic column holds for it, and each topic's members, region id -> slot.
#
# Rows joined in bulk (`join_later`: a new term's first round, a million first reports in a
# few seconds) are kept as the code, id and slot columns they came in, whatever topics they
# name. The first reader of any topic sorts them by topic in one pass (tens of ms at a
# million rows); each topic's dict inserts wait for that topic's own first reader or
# change. So the heartbeats do neither, and the first purge round, which reads a topic at a
# time and yields in between, does the inserts a topic at a time.

_NO_MEMBERS: Final[dict[int, int]] = {}
_INT16_CODES: Final = 32_767
"""Topic codes that fit an int16, which numpy sorts by radix."""


class TopicIndex:
    """Topic codes (assigned on first use, never reused) and the rows naming each topic.
    Dicts of strings and ints only: nothing here is tracked by the garbage collector."""

    def __init__(self) -> None:
        self._members: dict[str, dict[int, int]] = {}
        """Topic -> {region id -> slot} of the rows naming it (with `_sorted` and
        `_later`)."""
        self._later: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
        """Topic codes, region ids and slots joined and not yet sorted by topic, one
        array in each list per bulk join (arrays are not tracked by the GC, and three
        lists are three objects however many joins wait)."""
        self._sorted: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        """Topic -> (region ids, slots, the positions in them of its rows) sorted out of
        `_later` and not yet in the topic's dict."""
        self._codes: dict[str, int] = {}
        self._names: list[str] = []

    @property
    def names(self) -> list[str]:
        """Topic by code (live: do not modify)."""
        return self._names

    def code_of(self, topic: str) -> int:
        """The topic's code (assigned on first use)."""
        code = self._codes.get(topic)
        if code is None:
            code = self._codes[topic] = len(self._names)
            self._names.append(topic)
        return code

    def codes_of(self, topics: Iterable[str]) -> np.ndarray:
        """Each topic's code, -1 for a topic no row has ever named."""
        return np.fromiter(map(self._codes.get, topics, repeat(-1)), np.int32)

    def topics(self) -> list[str]:
        """Topics with at least one row."""
        self._sort()
        return list(self._members)

    def __contains__(self, topic: object) -> bool:
        self._sort()
        return topic in self._members

    def members(self, topic: str) -> dict[int, int]:
        """Region id -> slot of the rows naming `topic` (live: do not modify)."""
        self._settle(topic)
        return self._members.get(topic, _NO_MEMBERS)

    def join(self, topic: str, region_ids: Iterable[int], slots: Iterable[int]) -> None:
        """Rows (region id and slot, pairwise) now naming `topic`."""
        self._settle(topic)
        members = self._members.get(topic)
        if members is None:
            members = self._members[topic] = {}
        members.update(zip(region_ids, slots, strict=True))

    def join_later(self, codes: np.ndarray, region_ids: np.ndarray, slots: np.ndarray) -> None:
        """`join` each row to the topic of its code (`code_of`), the sort by topic and the
        dict inserts left to readers (rows that have no member entry yet, distinct: a
        term's first reports). Copies are kept: an id column may be a view of a
        heartbeat's body."""
        if len(codes):
            for waiting, column in zip(self._later, (codes, region_ids, slots), strict=True):
                waiting.append(column.copy())

    def leave(self, topic: str, region_id: int) -> None:
        """The region's row no longer names `topic`."""
        self._settle(topic)
        members = self._members.get(topic)
        if members is not None:
            members.pop(region_id, None)
            if not members:
                del self._members[topic]

    def _sort(self) -> None:
        """Sort the rows joined in bulk by topic, into `_sorted`: one pass over their codes
        (a radix sort while there are fewer than 32,768 topics); the ids and slots are
        gathered a topic at a time, by `_settle`."""
        if not self._later[0]:
            return
        later, self._later = self._later, ([], [], [])
        codes, ids, slots = map(np.concatenate, later)
        narrow = codes.astype(np.int16) if len(self._names) <= _INT16_CODES else codes
        order = np.argsort(narrow, kind="stable")
        counts = np.bincount(codes, minlength=len(self._names))
        stop = 0
        for code in np.flatnonzero(counts).tolist():
            start, stop = stop, stop + int(counts[code])
            topic = self._names[code]
            if topic not in self._members:
                self._members[topic] = {}
            self._sorted.setdefault(topic, []).append((ids, slots, order[start:stop]))

    def _settle(self, topic: str) -> None:
        """Put the topic's rows joined in bulk in its dict."""
        self._sort()
        waiting = self._sorted.pop(topic, None)
        if waiting:
            members = self._members[topic]  # `_sort` made it
            for ids, slots, at in waiting:
                members.update(zip(ids[at].tolist(), slots[at].tolist(), strict=True))


# The slots of each datanode's regions, kept between its heartbeats (`SlotMemo`).
#
# A datanode reports the same regions in the same order heartbeat after heartbeat, so
# comparing two arrays replaces a dict lookup per region (a cache miss each, at a million
# regions). A memo is valid only while no row of the table has been discarded since: a
# freed slot may be handed to another region.
#
# Before a datanode's first heartbeat of a term, the map's word is kept instead (`expect`):
# the regions mapped to it, ascending, and their prepared slots. A first heartbeat that names
# exactly those, in any order, is matched by one sort instead of a lookup and a duplicate
# check of every region; it is then remembered as sent.


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


# One topic's rows copied out of a `StatTable`, as of the copy (`TopicCopy`): what a purge
# plans from (`RegionRegistry.topic_snapshot`), once per topic per round.
#
# The copy takes a handful of C-level passes over the topic's rows and builds nothing per
# row: the topic's member dict is copied whole (region id -> the table's slot), and the
# columns are gathered in slot order. A slot of the table is found among the copied rows by
# bisection. A copy that numbered its rows afresh would insert every region id into two new
# dicts: at a million rows in 64 topics that was 0.55 s of a purge round, measured in process,
# and a new leader's first round runs while the first reports still arrive.


class TopicCopy:
    """The rows of one topic, copied: read through `TopicRows` (`topic_rows`), by the slots
    they had in the table they came from. Later writes to that table do not show."""

    def __init__(self, topic: str, members: dict[int, int], table: StatTable) -> None:
        held = np.sort(np.fromiter(members.values(), np.intp, len(members)))
        self._held = held
        """The table's slots of the copied rows, ascending: row i was in `held[i]`."""
        self._columns = {name: column[held] for name, column in table._columns.items()}
        if not len(held):
            self._columns = _new_columns(1)  # a row 0 to stand in (`TopicRows.columns_of`)
        self._names = table._topics.names  # codes are never reused: a later topic only adds
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
        return _row(self._columns, self._names, int(np.searchsorted(self._held, slot)))

    def rows(self, slots: np.ndarray) -> list[StatRow]:
        return _rows(self._columns, self._names, self._local(slots))

    def received_at(self, slots: np.ndarray) -> np.ndarray:
        received: np.ndarray = self._columns["received"][self._local(slots)]
        return received

    def prunable_at(self, slots: np.ndarray) -> np.ndarray:
        prunable: np.ndarray = self._columns["prunable"][self._local(slots)]
        return prunable


INITIAL_CAPACITY: Final = 1024
_NODE_OF: Final = attrgetter("node_id")


class StatTable:
    """Region rows as columns; see the module docstring.

    A slot (`lookup`) is a row's place in the columns: valid until the row is discarded,
    and what the batch operations (`judge`, `checkpoint_changed`, `assign`) take.
    """

    def __init__(self, capacity: int = INITIAL_CAPACITY) -> None:
        self._topics = TopicIndex()
        self._columns = _new_columns(capacity)
        """`SCHEMA`'s columns by name, indexed by slot."""
        self._ids = np.zeros(capacity, np.int64)
        """The region id of each slot in use."""
        self._expect = np.full(capacity, -1, np.int32)
        """A prepared slot's mapped topic code (`prepare`), -1 for any other."""
        self._end = 0
        """Slots below this have been used."""
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
        return slot is not None and self._columns["topic"][slot] >= 0

    def get(self, region_id: int) -> StatRow | None:
        """The region's row, or None when it has none."""
        slot = self._slot.get(region_id)
        return None if slot is None or self._columns["topic"][slot] < 0 else self.row(slot)

    def row(self, slot: int) -> StatRow:
        """The row stored in `slot`."""
        return _row(self._columns, self._topics.names, slot)

    def rows(self, slots: np.ndarray) -> list[StatRow]:
        """The rows in `slots`, in order, a column at a time."""
        return _rows(self._columns, self._topics.names, slots)

    def received_at(self, slots: np.ndarray) -> np.ndarray:
        """The rows' receive times (monotonic clock), per slot."""
        received: np.ndarray = self._columns["received"][slots]
        return received

    def node_at(self, slots: np.ndarray) -> np.ndarray:
        """The datanodes the rows were reported by, per slot."""
        node: np.ndarray = self._columns["node"][slots]
        return node

    def prunable_at(self, slots: np.ndarray) -> np.ndarray:
        """The rows' prunable entry ids, per slot."""
        prunable: np.ndarray = self._columns["prunable"][slots]
        return prunable

    @property
    def end(self) -> int:
        """Every row's slot is below this."""
        return self._end

    @property
    def capacity(self) -> int:
        """Rows the columns hold before they grow (`reserve`)."""
        return len(self._ids)

    def columns(self, start: int = 0, stop: int | None = None) -> RowColumns:
        """Copies of the rows in slots `start` to `stop` (to `end` when None), as of now."""
        stop = self._end if stop is None else min(stop, self._end)
        used = np.flatnonzero(self._columns["topic"][start:stop] >= 0) + start
        taken = {name: column[used] for name, column in self._columns.items()}
        return RowColumns(list(self._topics.names), self._ids[used], **taken)

    def _bisect(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per region of `ids`: its slot among those `prepare` laid out in id order, and
        whether that slot is the region's (in use: a row or still prepared)."""
        start, stop = self._sorted
        at = np.minimum(np.searchsorted(self._ids[start:stop], ids) + start, stop - 1)
        held = (self._ids[at] == ids) & (
            (self._columns["topic"][at] >= 0) | (self._expect[at] >= 0)
        )
        return at, held

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
        at, held = self._bisect(np.array(region_ids, np.int64) if as_array is None else as_array)
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
        and the report moves it forward, the row names it and the report `regressed`).
        `manifest` None: every reported manifest version is null. A prepared slot's
        row names no topic (`prepared_for`)."""
        found = slots >= 0
        held = np.where(found, slots, 0)  # slot 0 stands in for the others; masked out
        columns = self._columns
        stored = columns["topic"][held]  # -1 for a prepared slot: no row yet
        named = found & (stored >= 0) & (stored == self._topics.codes_of(topic_names)[topics])
        backwards = named & regressed(
            columns["flushed"][held], columns["manifest"][held], flushed, manifest
        )
        return named & ~backwards, backwards

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

    def checkpoint_changed(
        self, slots: np.ndarray, node_id: int, prunable: np.ndarray
    ) -> np.ndarray:
        """Per slot (each holding a row): whether the values a region checkpoint holds,
        the prunable id and the node, differ from the stored ones."""
        columns = self._columns
        changed: np.ndarray = (columns["prunable"][slots] != prunable) | (
            columns["node"][slots] != node_id
        )
        return changed

    def checkpoints(self, region_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """`region_id -> (node_id, prunable_entry_id)` for those of `region_ids` that have
        a row, read a column at a time (no row is built)."""
        return self.checkpoints_at(self.lookup(list(region_ids)))

    def checkpoints_at(self, slots: np.ndarray) -> dict[int, tuple[int, int]]:
        """`checkpoints` of the rows in `slots` (-1, and slots without a row, skipped)."""
        slots = slots[self.holds_row(slots)]
        columns = self._columns
        node, prunable = columns["node"][slots].tolist(), columns["prunable"][slots].tolist()
        return dict(zip(self._ids[slots].tolist(), zip(node, prunable, strict=True), strict=True))

    def holds_row(self, slots: np.ndarray) -> np.ndarray:
        """Per slot of `slots` (-1: none): whether it holds a row (not a prepared slot)."""
        held: np.ndarray = slots >= 0
        held[held] = self._columns["topic"][slots[held]] >= 0
        return held

    def topic_rows(self, topic: str) -> TopicRows:
        """The live rows naming `topic` (empty when none)."""
        return TopicRows(self, topic)

    def members(self, topic: str) -> dict[int, int]:
        """Region id -> slot of the rows naming `topic` (live: do not modify)."""
        return self._topics.members(topic)

    def snapshot(self, topic: str) -> TopicRows:
        """The rows naming `topic`, copied as of now (`TopicCopy`: a purge plans from it)."""
        return TopicCopy(topic, self._topics.members(topic), self).topic_rows(topic)

    # --- writing ---------------------------------------------------------------------

    def assign(self, slots: np.ndarray, node_id: int, values: RowValues, received: float) -> None:
        """Overwrite rows in place (the heartbeat's steady state): every slot holds the
        row of the region `values` has at its place, which keeps its topic."""
        self._write(slots, node_id, received, values)

    def _write(
        self,
        slots: np.ndarray,
        node: int | np.ndarray,
        received: float | np.ndarray,
        values: RowValues | Mapping[str, np.ndarray],
    ) -> None:
        columns = self._columns
        columns["node"][slots] = node
        columns["received"][slots] = received
        if isinstance(values, RowValues):
            for name in REPORTED:
                columns[name][slots] = getattr(values, name)
        else:
            for name, column in values.items():
                columns[name][slots] = column

    def store(
        self,
        values: RowValues,
        topic_names: Sequence[str],
        topics: np.ndarray,
        node: int | np.ndarray,
        received: float | np.ndarray,
        slots: np.ndarray | None = None,
    ) -> np.ndarray:
        """Store the rows of distinct regions `values.ids`, region i naming topic
        `topic_names[topics[i]]`, whatever they held before: a row (moved to the topic
        if it named another), a prepared slot, or nothing. `slots`: their `lookup`, when
        the caller has it. Returns the rows' slots."""
        if not len(values):
            return np.zeros(0, np.intp)
        index = self._topics
        lut = index.codes_of(topic_names)
        for i in np.unique(topics[lut[topics] < 0]).tolist():
            lut[i] = index.code_of(topic_names[i])  # a topic no row named before
        codes = lut[topics]
        ids = values.ids
        if slots is None:
            slots = self.lookup(ids.tolist(), ids)
        at = slots.copy()
        had = self._columns["topic"][np.where(slots >= 0, slots, 0)]
        had[slots < 0] = -1  # -1: no row (a prepared slot, or none)
        for i in np.flatnonzero((had >= 0) & (had != codes)).tolist():
            # A row that named another topic (rare: a region moved, or put by hand).
            region_id, slot = int(ids[i]), int(slots[i])
            index.leave(index.names[had[i]], region_id)
            index.join(topic_names[topics[i]], (region_id,), (slot,))
        joining = had < 0
        if joining.any():
            prepared = at[joining]
            self._unprepare(prepared[prepared >= 0])
            fresh = joining & (at < 0)
            if fresh.any():
                new = self._new_slots(ids[fresh].tolist())
                self._ids[new] = ids[fresh]
                at[fresh] = new
            # Membership by topic: sorted into the topics' dicts by their next reader.
            index.join_later(codes[joining], ids[joining], at[joining])
        self._columns["topic"][at] = codes
        self._write(at, node, received, values)
        return at

    def put_many(self, region_ids: list[int], rows: list[StatRow]) -> None:
        """Store rows as they are read (`store`, a column at a time): rows put by hand,
        the registry's `put_topic_rows`."""
        if not region_ids:
            return
        columns = _columns_of_rows(rows)
        topics = list(map(attrgetter("topic"), rows))
        names = list(dict.fromkeys(topics))
        position = {name: i for i, name in enumerate(names)}
        node, received = columns.pop("node"), columns.pop("received")
        values = RowValues(np.array(region_ids, np.int64), **columns)
        topic = np.fromiter(map(position.__getitem__, topics), np.intp, len(topics))
        self.store(values, names, topic, node, received)

    def put(self, region_id: int, row: StatRow) -> None:
        """`put_many` of one row."""
        self.put_many([region_id], [row])

    def _new_slots(self, region_ids: list[int]) -> np.ndarray:
        """Free slots for `region_ids`, put in the index."""
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
        topic = self._columns["topic"]
        if topic[slot] >= 0:
            self._topics.leave(self._topics.names[topic[slot]], region_id)
        else:
            self._unprepare(np.array([slot], np.intp))
        topic[slot] = -1
        self._free.append(slot)
        self._discards += 1

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
            found = self._bisect(ids)[1]
        missed = np.flatnonzero(~found)
        if len(missed) and len(self._slot) > int(found.sum()):
            index = self._slot
            found[missed] = [rid in index for rid in ids[missed].tolist()]
        return found

    def _unprepare(self, slots: np.ndarray) -> None:
        """Prepared `slots` now hold rows (or were discarded)."""
        self._expect[slots] = -1
        self._prepared -= len(slots)

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` rows now (a new leader, before the first reports of
        every mapped region: growing then would copy every column while they arrive)."""
        if capacity > len(self._ids):
            self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        grown = _new_columns(capacity)
        for name, column in self._columns.items():
            grown[name][: len(column)] = column
        self._columns = grown
        for name, fill in (("_ids", 0), ("_expect", -1)):
            old: np.ndarray = getattr(self, name)
            new = np.full(capacity, fill, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)


class DirtyRows:
    """The rows of one table whose checkpoints are to be written (the checkpointer's
    dirty set): a flag per slot, so a region that changes on every heartbeat between two
    flushes is held once, marking a heartbeat's regions is one column operation, and a
    flush reads the flagged rows' checkpoints by slot (`take`, `StatTable.checkpoints_at`)
    without looking a region id up. A Python set of ids cost 2-3x the first round's
    per-heartbeat time (`benchmarks/first_reports.py`, round 0: ~0.35 ms more per
    1,000-region heartbeat). A flag left on a slot whose row was discarded is dropped;
    one on a slot handed to another region since writes that region's checkpoint, which
    is correct, once more."""

    def __init__(self, table: StatTable) -> None:
        self.table = table
        """The table whose slots are flagged (a new term's table gets a new set)."""
        self._flags = np.zeros(table.capacity, bool)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def mark(self, region_ids: list[int]) -> None:
        """Flag the rows of `region_ids` (a region without one is skipped)."""
        slots = self.table.lookup(region_ids)
        self.mark_slots(slots[self.table.holds_row(slots)])

    def mark_slots(self, slots: np.ndarray) -> None:
        """Flag the rows in `slots` (`Judged.dirty_rows`)."""
        if len(self._flags) < self.table.capacity:
            grown = np.zeros(self.table.capacity, bool)
            grown[: len(self._flags)] = self._flags
            self._flags = grown
        self._count += int(np.count_nonzero(~self._flags[slots]))
        self._flags[slots] = True

    def take(self) -> np.ndarray:
        """The flagged slots, ascending; the flags are cleared (every one: no scatter)."""
        end = self.table.end
        slots = np.flatnonzero(self._flags[:end])
        self._flags[:end] = False
        self._count = 0
        return slots
