"""Which rows of a `StatTable` name which topic (`TopicIndex`): each topic's code, the value
the table's topic column holds for it, and each topic's members, region id -> slot.

Rows joined in bulk (`join_later`: a new term's first round, a million first reports in a
few seconds) are kept as the code, id and slot columns they came in, whatever topics they
name, and sorted into the topics' dicts when something first reads or changes any
topic's members: the sort and the dict inserts then run once, in whoever reads (the
first purge round, after every region reported), not in the heartbeats."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise, repeat
from typing import Final

import numpy as np

_NO_MEMBERS: Final[dict[int, int]] = {}


class TopicIndex:
    """Topic codes (assigned on first use, never reused) and the rows naming each topic.
    Dicts of strings and ints only: nothing here is tracked by the garbage collector."""

    def __init__(self) -> None:
        self._members: dict[str, dict[int, int]] = {}
        """Topic -> {region id -> slot} of the rows naming it (with `_later`)."""
        self._later: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        """(topic codes, region ids, slots) columns joined since the dicts were last
        read, one entry per bulk join (arrays are not tracked by the GC)."""
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
        if self._later:
            self._settle()
        return list(self._members)

    def __contains__(self, topic: object) -> bool:
        if self._later:
            self._settle()
        return topic in self._members

    def members(self, topic: str) -> dict[int, int]:
        """Region id -> slot of the rows naming `topic` (live: do not modify)."""
        if self._later:
            self._settle()
        return self._members.get(topic, _NO_MEMBERS)

    def join(self, topic: str, region_ids: Iterable[int], slots: Iterable[int]) -> None:
        """Rows (region id and slot, pairwise) now naming `topic`."""
        if self._later:
            self._settle()
        members = self._members.get(topic)
        if members is None:
            members = self._members[topic] = {}
        members.update(zip(region_ids, slots, strict=True))

    def join_later(self, codes: np.ndarray, region_ids: np.ndarray, slots: np.ndarray) -> None:
        """`join` each row to the topic of its code (`code_of`), the sort by topic and the
        dict inserts left to the next reader (rows that have no member entry yet,
        distinct: a term's first reports). Copies are kept: an id column may be a view
        of a heartbeat's body."""
        if len(codes):
            self._later.append((codes.copy(), region_ids.copy(), slots.copy()))

    def _settle(self) -> None:
        later, self._later = self._later, []
        codes = np.concatenate([part[0] for part in later])
        order = np.argsort(codes, kind="stable")
        codes = codes[order]
        ids = np.concatenate([part[1] for part in later])[order]
        slots = np.concatenate([part[2] for part in later])[order]
        cuts = [0, *(np.flatnonzero(np.diff(codes)) + 1).tolist(), len(codes)]
        for start, stop in pairwise(cuts):
            topic = self._names[int(codes[start])]
            members = self._members.get(topic)
            if members is None:
                members = self._members[topic] = {}
            members.update(zip(ids[start:stop].tolist(), slots[start:stop].tolist(), strict=True))

    def leave(self, topic: str, region_id: int) -> None:
        """The region's row no longer names `topic`."""
        if self._later:
            self._settle()
        members = self._members.get(topic)
        if members is not None:
            members.pop(region_id, None)
            if not members:
                del self._members[topic]
