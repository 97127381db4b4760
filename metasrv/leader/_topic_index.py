"""Which rows of a `StatTable` name which topic (`TopicIndex`): each topic's code, the value
the table's topic column holds for it, and each topic's members, region id -> slot.

Rows joined in bulk (`join_later`: a new term's first round, a million first reports in a
few seconds) are kept as the id and slot lists they came in, and put in the topic's dict
when something first reads or changes that topic's members: the dict inserts then run
a topic at a time in whoever reads (the first purge round, after every region reported),
not in the heartbeats."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Final

import numpy as np

_NO_MEMBERS: Final[dict[int, int]] = {}


class TopicIndex:
    """Topic codes (assigned on first use, never reused) and the rows naming each topic.
    Dicts of strings and ints only: nothing here is tracked by the garbage collector."""

    def __init__(self) -> None:
        self._members: dict[str, dict[int, int]] = {}
        """Topic -> {region id -> slot} of the rows naming it (with `_later`)."""
        self._later: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        """Topic -> (region id columns, slot columns) joined since its dict was last
        read: a list per topic, however many rows (arrays are not tracked by the GC)."""
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
        return list(self._members)

    def __contains__(self, topic: object) -> bool:
        return topic in self._members

    def members(self, topic: str) -> dict[int, int]:
        """Region id -> slot of the rows naming `topic` (live: do not modify)."""
        if topic in self._later:
            self._settle(topic)
        return self._members.get(topic, _NO_MEMBERS)

    def join(self, topic: str, region_ids: Iterable[int], slots: Iterable[int]) -> None:
        """Rows (region id and slot, pairwise) now naming `topic`."""
        members = self.members(topic) if topic in self._members else None
        if members is None:
            members = self._members[topic] = {}
        members.update(zip(region_ids, slots, strict=True))

    def join_later(self, topic: str, region_ids: np.ndarray, slots: np.ndarray) -> None:
        """`join`, the dict inserts left to the topic's next reader (rows that have no
        member entry yet, distinct: a term's first reports)."""
        if topic not in self._members:
            self._members[topic] = {}
        later = self._later.get(topic)
        if later is None:
            self._later[topic] = ([region_ids], [slots])
        else:
            later[0].append(region_ids)
            later[1].append(slots)

    def _settle(self, topic: str) -> None:
        ids, slots = self._later.pop(topic)
        self._members[topic].update(
            zip(np.concatenate(ids).tolist(), np.concatenate(slots).tolist(), strict=True)
        )

    def leave(self, topic: str, region_id: int) -> None:
        """The region's row no longer names `topic`."""
        if topic in self._later:
            self._settle(topic)
        members = self._members.get(topic)
        if members is not None:
            members.pop(region_id, None)
            if not members:
                del self._members[topic]
