"""Which rows of a `StatTable` name which topic (`TopicIndex`): each topic's code, the value
the table's topic column holds for it, and each topic's members, region id -> slot.

Rows joined in bulk (`join_later`: a new term's first round, a million first reports in a
few seconds) are kept as the code, id and slot columns they came in, whatever topics they
name. The first reader of any topic sorts them by topic in one pass (tens of ms at a
million rows); each topic's dict inserts wait for that topic's own first reader or
change. So the heartbeats do neither, and the first purge round, which reads a topic at a
time and yields in between, does the inserts a topic at a time."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Final

import numpy as np

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
        self._later: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        """(topic codes, region ids, slots) columns joined and not yet sorted by topic,
        one entry per bulk join (arrays are not tracked by the GC)."""
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
            self._later.append((codes.copy(), region_ids.copy(), slots.copy()))

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
        if not self._later:
            return
        later, self._later = self._later, []
        codes = np.concatenate([part[0] for part in later])
        ids = np.concatenate([part[1] for part in later])
        slots = np.concatenate([part[2] for part in later])
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
