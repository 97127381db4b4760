"""The leader's region stats: region -> row (`StatTable`), each row naming one topic
(topic -> regions, `TopicIndex`), read a topic at a time (`TopicRows`: live, or copied,
`TopicCopy`). What a row holds is declared once (`RowColumns`' fields, `SCHEMA`); the
table's storage, the `StatRow`s it reads out and its copies are derived from it.

The rows are stored as columns (numpy arrays indexed by slot). A slot is this module's
business: callers name regions by id, hand a heartbeat's columns to `StatTable.judge`
and get a `Verdict` back (what the stored rows say of each region; the slots it found
stay inside it), which stores what the heartbeat's judge accepted (`Verdict.store`) and
tells the checkpointer's dirty set (`DirtyRows`) which rows changed. A heartbeat of a
thousand regions is a handful of whole-column operations: look the slots up (a
C-level dict pass, or not at all: `SlotMemo`), compare the reported values
with the stored ones and assign them in place; first reports and moved regions are
stored a column at a time too. No object is built per region on that path, and nothing
here is tracked by the garbage collector.

A new leader's table is `prepare`d with a slot for every mapped region, before any
heartbeat: the index is built once, from the map, a C-level pass, so a region's first
report is a column operation like every later one (no insert into a million-entry
dict per region while the first round of a million reports arrives). A prepared slot is
not a row until its region reports: it is in no topic's members, not counted, not read
(`StatTable._row_codes` is the one place that tells a row from a prepared or no slot).
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
from metasrv.wire import Columns


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
    """Copies of some rows' columns (`StatTable.slices`): `topic` indexes `names`, a null
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


def _held(slots: np.ndarray) -> np.ndarray:
    """`slots` as indices into the columns: -1 (no slot) reads slot 0, which every table
    and copy has; the caller masks those out."""
    return np.where(slots >= 0, slots, 0)


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


def columns_of_rows(region_ids: list[int], rows: list[StatRow]) -> RowColumns:
    """Rows of distinct regions as columns, in order, without a table (reports kept apart
    from it: the stat history's rejected ones)."""
    names = list(dict.fromkeys(map(attrgetter("topic"), rows)))
    code = {name: i for i, name in enumerate(names)}
    columns: dict[str, np.ndarray] = {}
    for c in SCHEMA:
        values: list[Any] = list(map(attrgetter(c.row), rows))
        if c.name == "topic":
            values = list(map(code.__getitem__, values))
        elif c.nullable:
            values = or_null(values)
        columns[c.name] = np.array(values, c.dtype)
    return RowColumns(names, np.array(region_ids, np.int64), **columns)


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
    count at the time (`StatTable.judge`, `Verdict.remember`)."""

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
    """What `TopicRows` reads, by slot: a `StatTable`, or one topic's rows copied
    (`TopicCopy`)."""

    def _members(self, topic: str) -> dict[int, int]: ...
    def _row(self, slot: int) -> StatRow: ...
    def _rows(self, slots: np.ndarray) -> list[StatRow]: ...
    def _received_at(self, slots: np.ndarray) -> np.ndarray: ...
    def _prunable_at(self, slots: np.ndarray) -> np.ndarray: ...


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
        return self._table._members(self.topic)

    def __getitem__(self, region_id: int) -> StatRow:
        return self._table._row(self._members[region_id])

    @overload
    def get(self, region_id: int, /) -> StatRow | None: ...
    @overload
    def get(self, region_id: int, /, default: Any) -> Any: ...
    def get(self, region_id: int, /, default: Any = None) -> Any:
        slot = self._members.get(region_id)
        return default if slot is None else self._table._row(slot)

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
        rows = self._table._rows(np.fromiter(members.values(), np.intp, len(ids)))
        return list(zip(ids, rows, strict=True))

    def values(self) -> list[StatRow]:  # type: ignore[override]
        members = self._members
        return self._table._rows(np.fromiter(members.values(), np.intp, len(members)))

    def _slots_of(self, region_ids: list[int]) -> np.ndarray:
        """Each region's slot among the topic's rows, -1 where it has none."""
        return np.fromiter(map(self._members.get, region_ids, repeat(-1)), np.intp, len(region_ids))

    def rows_of(self, region_ids: list[int]) -> list[StatRow | None]:
        """Each region's row, None where the topic has none, built a column at a time
        (the planner's per-region pass over a topic with missing or stale stats)."""
        slots = self._slots_of(region_ids)
        found = slots >= 0
        if found.all():
            return list(self._table._rows(slots))
        out: list[StatRow | None] = [None] * len(region_ids)
        at = np.flatnonzero(found).tolist()
        for i, row in zip(at, self._table._rows(slots[found]), strict=True):
            out[i] = row
        return out

    def columns_of(self, region_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per region of `region_ids`: whether the topic has its row, and the row's
        received time and prunable id (meaningless where it has none)."""
        slots = self._slots_of(region_ids)
        found = slots >= 0
        held = _held(slots)
        return found, self._table._received_at(held), self._table._prunable_at(held)

    def lowest_prunable(self, fresh_after: float) -> int | None:
        """The lowest prunable entry id of the topic's rows, or None when there are no
        rows or one was received before `fresh_after` (stale)."""
        members = self._members
        if not members:
            return None
        slots = np.fromiter(members.values(), np.intp, len(members))
        if self._table._received_at(slots).min() < fresh_after:
            return None
        return int(self._table._prunable_at(slots).min())

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
            self._columns = _new_columns(1)  # a row 0 to stand in (`_held`)
        self._names = table._topics.names  # codes are never reused: a later topic only adds
        self._name = topic
        self._copied = members.copy()
        """Region id -> the table's slot (a dict copy: no insert per region)."""

    def _members(self, topic: str) -> dict[int, int]:
        """Region id -> the table's slot of the copied rows naming `topic`."""
        return self._copied if topic == self._name else {}

    def topic_rows(self, topic: str) -> TopicRows:
        """The copied rows naming `topic` as a read-only mapping (empty for another)."""
        return TopicRows(self, topic)

    def _local(self, slots: np.ndarray) -> np.ndarray:
        local: np.ndarray = np.searchsorted(self._held, slots)
        return local

    def _row(self, slot: int) -> StatRow:
        return _row(self._columns, self._names, int(np.searchsorted(self._held, slot)))

    def _rows(self, slots: np.ndarray) -> list[StatRow]:
        return _rows(self._columns, self._names, self._local(slots))

    def _received_at(self, slots: np.ndarray) -> np.ndarray:
        received: np.ndarray = self._columns["received"][self._local(slots)]
        return received

    def _prunable_at(self, slots: np.ndarray) -> np.ndarray:
        prunable: np.ndarray = self._columns["prunable"][self._local(slots)]
        return prunable


INITIAL_CAPACITY: Final = 1024
_NODE_OF: Final = attrgetter("node_id")


class StatTable:
    """Region rows as columns; see the module docstring. Callers name regions by id; a
    slot (a row's place in the columns, valid until the row is discarded) stays in this
    module."""

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
        """Rows discarded so far: a slot `SlotMemo` kept before a discard may be reused."""
        self._memo = SlotMemo()
        self._prepared = 0
        """Slots prepared whose region has not reported (in `_slot`, not rows)."""

    # --- what a slot holds -------------------------------------------------------------

    def _row_codes(self, slots: np.ndarray, held: np.ndarray | None = None) -> np.ndarray:
        """Per slot of `slots` (-1: none), the topic code of the row it holds; -1 where it
        holds no row: no slot, or a prepared one (not a row until its region reports).
        The one test of "is this a row". `held`: `_held(slots)`, when the caller has it."""
        codes: np.ndarray = self._columns["topic"][_held(slots) if held is None else held]
        codes[slots < 0] = -1
        return codes

    def _prepared_codes(self, slots: np.ndarray) -> np.ndarray:
        """Per slot of `slots` (-1: none), the topic code it was prepared for (`prepare`),
        -1 where it is not a prepared slot (a row, or no slot)."""
        codes: np.ndarray = self._expect[_held(slots)]
        codes[slots < 0] = -1
        return codes

    def _row_slot(self, region_id: object) -> int | None:
        """The slot of the region's row, None when it has none."""
        slot = self._slot.get(region_id)  # type: ignore[call-overload]
        if slot is None or self._row_codes(np.array([slot], np.intp))[0] < 0:
            return None
        return int(slot)

    # --- reading ---------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Topics with at least one row."""
        return self._topics.topics()

    def __len__(self) -> int:
        return len(self._slot) - self._prepared

    def __contains__(self, region_id: object) -> bool:
        return self._row_slot(region_id) is not None

    def get(self, region_id: int) -> StatRow | None:
        """The region's row, or None when it has none."""
        slot = self._row_slot(region_id)
        return None if slot is None else self._row(slot)

    def _row(self, slot: int) -> StatRow:
        return _row(self._columns, self._topics.names, slot)

    def _rows(self, slots: np.ndarray) -> list[StatRow]:
        return _rows(self._columns, self._topics.names, slots)

    def _received_at(self, slots: np.ndarray) -> np.ndarray:
        received: np.ndarray = self._columns["received"][slots]
        return received

    def _prunable_at(self, slots: np.ndarray) -> np.ndarray:
        prunable: np.ndarray = self._columns["prunable"][slots]
        return prunable

    def _members(self, topic: str) -> dict[int, int]:
        return self._topics.members(topic)

    def slices(self, size: int) -> Iterator[RowColumns]:
        """Copies of every row, `size` slots' worth at a time, each taken when it is
        asked for (a reader that yields in between sees later writes in later slices)."""
        start = 0
        while start < self._end:
            yield self._copy(start, start + size)
            start += size

    def _copy(self, start: int, stop: int) -> RowColumns:
        stop = min(stop, self._end)
        used = np.flatnonzero(self._row_codes(np.arange(start, stop)) >= 0) + start
        taken = {name: column[used] for name, column in self._columns.items()}
        return RowColumns(list(self._topics.names), self._ids[used], **taken)

    def _checkpoints_at(self, slots: np.ndarray) -> dict[int, tuple[int, int]]:
        """`region_id -> (node_id, prunable_entry_id)` of the rows in `slots` (-1, and
        slots without a row, skipped), read a column at a time (no row is built)."""
        slots = slots[self._row_codes(slots) >= 0]
        columns = self._columns
        node, prunable = columns["node"][slots].tolist(), columns["prunable"][slots].tolist()
        return dict(zip(self._ids[slots].tolist(), zip(node, prunable, strict=True), strict=True))

    def snapshot(self, topic: str) -> TopicRows:
        """The rows naming `topic`, copied as of now (`TopicCopy`: a purge plans from it)."""
        return TopicCopy(topic, self._topics.members(topic), self).topic_rows(topic)

    # --- finding slots ---------------------------------------------------------------

    def _lookup(self, region_ids: list[int]) -> np.ndarray:
        """Each region's slot, -1 for a region without one (one C-level pass). A
        prepared slot (no row yet) is a slot."""
        return np.fromiter(map(self._slot.get, region_ids, repeat(-1)), np.intp, len(region_ids))

    # --- judging a heartbeat ----------------------------------------------------------

    def judge(self, node_id: int, cols: Columns) -> Verdict:
        """What the stored rows say of a heartbeat's regions, a column at a time
        (`Verdict`); stores nothing. The slots come from `SlotMemo` when this datanode
        sends the regions it sent last time (or the map gave it: `prepare`), else from
        `_lookup`."""
        ids = cols.region_id
        slots = self._memo.recall(node_id, ids, self._discards, len(self._slot))
        recalled = slots is not None
        distinct = True
        if slots is None:
            id_list = ids.tolist()
            distinct = len(set(id_list)) == len(id_list)
            slots = self._lookup(id_list)
        codes = self._topics.codes_of(cols.topic_names)[cols.topic]
        held = _held(slots)
        stored = self._row_codes(slots, held)
        named = (stored >= 0) & (stored == codes)
        columns = self._columns
        if not recalled:
            # A row another datanode reported is not this one's to update: the route
            # decides (the judge's `by_route`).
            named &= columns["node"][held] == node_id
        backwards = named & regressed(
            columns["flushed"][held], columns["manifest"][held], cols.flushed, cols.manifest
        )
        steady = named & ~backwards
        return Verdict(self, node_id, cols, slots, codes, recalled, distinct, steady, backwards)

    # --- writing ---------------------------------------------------------------------

    def _write(
        self,
        slots: np.ndarray,
        node: int,
        received: float,
        values: RowValues,
    ) -> None:
        columns = self._columns
        columns["node"][slots] = node
        columns["received"][slots] = received
        for name in REPORTED:
            columns[name][slots] = getattr(values, name)

    def _store(
        self,
        values: RowValues,
        topic_names: Sequence[str],
        topics: np.ndarray,
        node: int,
        received: float,
        slots: np.ndarray,
    ) -> np.ndarray:
        """Store the rows of distinct regions `values.ids`, region i naming topic
        `topic_names[topics[i]]`, whatever they held before: a row (moved to the topic
        if it named another), a prepared slot, or nothing. `slots`: their `_lookup`.
        Returns the rows' slots."""
        if not len(values):
            return np.zeros(0, np.intp)
        index = self._topics
        lut = index.codes_of(topic_names)
        for i in np.unique(topics[lut[topics] < 0]).tolist():
            lut[i] = index.code_of(topic_names[i])  # a topic no row named before
        codes = lut[topics]
        ids = values.ids
        at = slots.copy()
        had = self._row_codes(slots)
        for i in np.flatnonzero((had >= 0) & (had != codes)).tolist():
            # A row that named another topic (rare: a region moved).
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
        at = np.array([slot], np.intp)
        code = int(self._row_codes(at)[0])
        if code >= 0:
            self._topics.leave(self._topics.names[code], region_id)
        else:
            self._unprepare(at)
        self._columns["topic"][slot] = -1
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
        # In region id order: `SlotMemo.expect` keeps each datanode's ids ascending.
        ids = np.concatenate(columns)
        order = np.argsort(ids, kind="stable")
        ids, expect = ids[order], np.concatenate(codes)[order]
        node = np.concatenate(nodes)[order] if len(nodes) == len(columns) else None
        if self._slot:
            # Those with a slot already (a warm follower's table at take-over) are skipped;
            # no datanode's list is whole.
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
        self._prepared += n
        if node is not None:
            self._memo.expect(node, ids, np.arange(start, stop), self._discards)
        return n

    def _has_slot(self, ids: np.ndarray) -> np.ndarray:
        """Per region of `ids`: whether it has a slot (a row or a prepared one), in the
        index."""
        index = self._slot
        return np.fromiter(map(index.__contains__, ids.tolist()), bool, len(ids))

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


class Verdict:
    """One heartbeat's regions (a `Columns`: region i is its i-th) judged against a
    table's rows (`StatTable.judge`), then told what the heartbeat's judge accepted
    (`accept_steady`, `accept_fresh`) and stored into that table (`store`). The slots it
    found stay inside."""

    __slots__ = (
        "_changed",
        "_codes",
        "_cols",
        "_fresh",
        "_fresh_slots",
        "_fresh_topics",
        "_node",
        "_slots",
        "_steady",
        "_steady_slots",
        "_stored",
        "_table",
        "distinct",
        "recalled",
        "regressed",
        "steady",
    )

    def __init__(
        self,
        table: StatTable,
        node_id: int,
        cols: Columns,
        slots: np.ndarray,
        codes: np.ndarray,
        recalled: bool,
        distinct: bool,
        steady: np.ndarray,
        regressed: np.ndarray,
    ) -> None:
        self._table = table
        self._node = node_id
        self._cols = cols
        self._slots = slots
        """Per region, its slot: a row, a prepared slot, or -1."""
        self._codes = codes
        """Per region, the code of the topic it names (-1: one no row ever named)."""
        self.recalled = recalled
        """The regions are those `SlotMemo` kept for this datanode, in the same order:
        distinct, and each one a row this datanode reported or a slot the map prepared
        for it (`StatTable.prepare`)."""
        self.distinct = distinct
        """No region is named twice."""
        self.steady = steady
        """Per region: a row names the topic it reports, this datanode may update it (it
        reported the row, or `recalled`), and the report does not move it back."""
        self.regressed = regressed
        """Per region: as `steady`, but the report would move the row back (`regressed`)."""
        self._steady: RowValues | None = None
        self._steady_slots: np.ndarray | None = None
        self._fresh: RowValues | None = None
        self._fresh_slots: np.ndarray | None = None
        self._fresh_topics: np.ndarray | None = None
        self._changed: np.ndarray | None = None
        self._stored = False

    def prepared(self, at: np.ndarray) -> np.ndarray:
        """Per region at positions `at`: whether its slot was prepared (`StatTable.prepare`)
        for the topic it names, which is the map's word when the term began."""
        codes = self._table._prepared_codes(self._slots[at])
        prepared: np.ndarray = (codes >= 0) & (codes == self._codes[at])
        return prepared

    def remember(self) -> None:
        """Every region has a row, or a prepared slot its report fills now: keep their
        slots for this datanode's next heartbeat (`SlotMemo`)."""
        if not self.recalled:
            table = self._table
            table._memo.remember(
                self._node, self._cols.region_id, self._slots, table._discards, len(table._slot)
            )

    def accept_steady(self, where: np.ndarray, values: RowValues) -> None:
        """The regions `where` (all of them `steady`) take `values`, in place."""
        slots = self._slots if bool(where.all()) else self._slots[where]
        self._steady, self._steady_slots = values, slots
        # Checkpoints hold the prunable id and the node: a change in either makes the
        # row dirty. Most heartbeats of an idle region change nothing.
        columns = self._table._columns
        changed = (columns["prunable"][slots] != values.prunable) | (
            columns["node"][slots] != self._node
        )
        if changed.any():
            self._changed = slots[changed]

    def accept_fresh(self, where: np.ndarray, values: RowValues) -> None:
        """The regions `where` are stored whatever their slots held (first reports, rows
        another datanode or another topic held), each naming the topic it reports."""
        self._fresh, self._fresh_slots = values, self._slots[where]
        self._fresh_topics = self._cols.topic[where]

    def store(self, now: float) -> None:
        """Write the accepted regions into the table they were judged against (unchanged
        since), received at `now`."""
        table = self._table
        self._stored = True
        if self._steady is not None and self._steady_slots is not None:
            table._write(self._steady_slots, self._node, now, self._steady)
        if self._fresh is not None and self._fresh_slots is not None:
            assert self._fresh_topics is not None  # set with `_fresh`
            self._fresh_slots = table._store(
                self._fresh,
                self._cols.topic_names,
                self._fresh_topics,
                self._node,
                now,
                self._fresh_slots,
            )

    def rows(self) -> dict[int, StatRow]:
        """After `store`: the accepted regions' rows, as stored."""
        rows: dict[int, StatRow] = {}
        for values, slots in ((self._steady, self._steady_slots), (self._fresh, self._fresh_slots)):
            if values is not None and slots is not None:
                rows.update(zip(values.ids.tolist(), self._table._rows(slots), strict=True))
        return rows

    def _dirty(self) -> np.ndarray:
        """After `store`: the slots of the rows whose checkpoints changed: the steady ones
        whose prunable id or node changed, and every fresh one (its first checkpoint, or
        a new node's); none before (a fresh region may have no slot yet)."""
        if not self._stored:
            return np.zeros(0, np.intp)
        parts = [slots for slots in (self._changed, self._fresh_slots) if slots is not None]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, np.intp)


class DirtyRows:
    """The rows of one table whose checkpoints are to be written (the checkpointer's
    dirty set): a flag per slot, so a region that changes on every heartbeat between two
    flushes is held once, marking a heartbeat's regions is one column operation, and a
    flush reads the flagged rows' checkpoints without looking a region id up (`take`).
    A Python set of ids cost 2-3x the first round's per-heartbeat time
    (`benchmarks/first_reports.py`, round 0: ~0.35 ms more per 1,000-region heartbeat).
    A flag left on a slot whose row was discarded is dropped; one on a slot handed to
    another region since writes that region's checkpoint, which is correct, once more."""

    def __init__(self, table: StatTable) -> None:
        self._table = table
        """The table whose rows are flagged (a new term's table gets a new set)."""
        self._flags = np.zeros(len(table._ids), bool)
        self._count = 0

    def over(self, table: StatTable) -> bool:
        """Whether this set flags `table`'s rows."""
        return self._table is table

    def __len__(self) -> int:
        return self._count

    def mark(self, region_ids: list[int]) -> None:
        """Flag the rows of `region_ids` (a region without one is skipped)."""
        table = self._table
        slots = table._lookup(region_ids)
        self._flag(slots[table._row_codes(slots) >= 0])

    def mark_judged(self, verdict: Verdict) -> None:
        """Flag the rows a stored heartbeat changed (`Verdict.store`); a heartbeat judged
        against another table (an older term's) flags nothing."""
        if verdict._table is self._table:
            self._flag(verdict._dirty())

    def _flag(self, slots: np.ndarray) -> None:
        capacity = len(self._table._ids)
        if len(self._flags) < capacity:
            grown = np.zeros(capacity, bool)
            grown[: len(self._flags)] = self._flags
            self._flags = grown
        self._count += int(np.count_nonzero(~self._flags[slots]))
        self._flags[slots] = True

    def take(self) -> PendingCheckpoints:
        """Every flagged row, for one flush; the flags are cleared (every one: no
        scatter)."""
        end = self._table._end
        slots = np.flatnonzero(self._flags[:end])
        self._flags[:end] = False
        self._count = 0
        return PendingCheckpoints(self, slots)


class PendingCheckpoints:
    """The rows a flush took from a dirty set (`DirtyRows.take`), read a batch at a time
    as `region_id -> (node_id, prunable_entry_id)` (`next_batch`)."""

    def __init__(self, dirty: DirtyRows, slots: np.ndarray) -> None:
        self._dirty = dirty
        self._slots = slots
        """Ascending."""
        self._next = 0
        self._last = 0
        """Where the last batch read began."""

    def __len__(self) -> int:
        """Rows not read yet."""
        return len(self._slots) - self._next

    @property
    def read(self) -> int:
        """Rows read so far (a row discarded since counts, unwritten)."""
        return self._next

    def next_batch(self, size: int) -> dict[int, tuple[int, int]]:
        """The checkpoints of the next `size` rows (a row discarded since is skipped)."""
        at = self._slots[self._next : self._next + size]
        self._last, self._next = self._next, self._next + len(at)
        return self._dirty._table._checkpoints_at(at)

    def put_back(self) -> None:
        """The last batch read and the rows after it were not written: flag them again
        (the next flush writes them)."""
        self._dirty._flag(self._slots[self._last :])
        self._next = len(self._slots)
