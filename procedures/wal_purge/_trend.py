"""The WAL trend the dashboard plots: retained WAL per topic over time, and the purges that
cut it, in bounded memory.

`TrendRing` keeps the last `capacity` samples. A sample is a wall-clock time and, for each
topic, the WAL Kafka retains (high watermark - log start, in entries) and its estimated
bytes. The times live in one ring shared by every topic; each topic has two `array('q')`
rings of `capacity` slots aligned with it, allocated once, so a topic costs 16 bytes per
sample slot whatever its number of regions: 3,856 bytes at the default 241 slots (an
hour sampled every 15 s), about 4.2 KB with its bookkeeping as measured by the tests,
so 270 KB for 64 topics. Two more rings hold the totals over all topics. A topic
missing from a sample (Kafka did not answer for it) has a gap there; a topic missing
from a whole ring of samples is forgotten.

Purges are `PurgeMark`s: each procedure once, ordered by finish time, at most
`purge_capacity` of them (the oldest go first; about 400 bytes each, so 1.6 MB at the
default 4,096), and the sampler drops those older than its window.

Pure: `_trend_sampler.py` feeds it; the API reads `view()`.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

GAP = -1
"""Stored for a topic not sampled at that time (and for bytes no datanode sized)."""

PURGE_CAPACITY = 4096
"""Default most purges kept."""


@dataclass(frozen=True, slots=True)
class Retained:
    """One topic's WAL in Kafka at one sample."""

    entries: int
    """High watermark - log start of partition 0."""
    bytes: int | None
    """`entries` x the topic's average record size as datanodes report it; None before
    any datanode reported the topic."""


@dataclass(frozen=True, slots=True)
class PurgeMark:
    """One completed purge, as the plots mark it."""

    at: float
    """Wall-clock finish time, epoch seconds."""
    topic: str
    procedure_id: str
    prune_point: int
    entries_deleted: int
    """Entries the purge freed (released, with logical deletion)."""
    bytes_estimated: int
    logical_delete: bool


@dataclass(frozen=True, slots=True)
class TopicSeries:
    """One topic's values, aligned with `TrendView.times`; None where not sampled."""

    topic: str
    entries: tuple[int | None, ...]
    bytes: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class TrendView:
    """What the ring holds, oldest first."""

    times: tuple[float, ...]
    """Sample times, wall clock, epoch seconds, never decreasing."""
    series: tuple[TopicSeries, ...]
    """The topics asked for, largest retained WAL (at the newest sample) first."""
    total_entries: tuple[int | None, ...]
    """Sum over every topic sampled at that time (not only those in `series`)."""
    total_bytes: tuple[int | None, ...]
    """Sum over the topics with a known size; None when none had one."""
    topics: int
    """Topics the ring holds."""
    purges: tuple[PurgeMark, ...]
    """Every purge kept, oldest first (not only those of `series`' topics)."""


def _opt(value: int) -> int | None:
    return None if value == GAP else value


class TrendRing:
    """The last `capacity` samples of every topic, and the latest purges."""

    def __init__(self, capacity: int, *, purge_capacity: int = PURGE_CAPACITY) -> None:
        if capacity < 1 or purge_capacity < 0:
            raise ValueError("capacity must be >= 1 and purge_capacity >= 0")
        self.capacity = capacity
        self.purge_capacity = purge_capacity
        self._times = array("d", bytes(8 * capacity))
        self._total_entries = array("q", [GAP]) * capacity
        self._total_bytes = array("q", [GAP]) * capacity
        self._entries: dict[str, array[int]] = {}
        self._bytes: dict[str, array[int]] = {}
        self._last_seen: dict[str, int] = {}
        """Topic -> number of the last sample that had it."""
        self._next = 0
        """Slot the next sample goes to."""
        self._count = 0
        """Samples held (<= capacity)."""
        self._recorded = 0
        """Samples ever recorded (numbers the samples for `_last_seen`)."""
        self._purges: list[tuple[float, str]] = []
        """(at, procedure id), sorted."""
        self._marks: dict[str, PurgeMark] = {}

    def __len__(self) -> int:
        return self._count

    def topics(self) -> list[str]:
        """Topics held, in the order first seen."""
        return list(self._entries)

    def clear(self) -> None:
        """Forget every sample and purge (a new leadership term starts afresh)."""
        self._entries.clear()
        self._bytes.clear()
        self._last_seen.clear()
        self._next = self._count = 0
        self._purges.clear()
        self._marks.clear()

    # -- samples -------------------------------------------------------------------------

    def record(self, at: float, retained: Mapping[str, Retained]) -> None:
        """Add a sample taken at `at` (raised to the previous sample's time if the clock
        stepped back), overwriting the oldest when full. Topics in `retained` are sampled;
        every other topic held gets a gap."""
        slot = self._next
        if self._count:
            at = max(at, self._times[(slot - 1) % self.capacity])
        self._times[slot] = at
        number = self._recorded
        total_entries, total_bytes = 0, GAP
        for topic, value in retained.items():
            entries = self._entries.get(topic)
            if entries is None:
                entries = self._entries[topic] = array("q", [GAP]) * self.capacity
                self._bytes[topic] = array("q", [GAP]) * self.capacity
            entries[slot] = value.entries
            self._bytes[topic][slot] = GAP if value.bytes is None else value.bytes
            self._last_seen[topic] = number
            total_entries += value.entries
            if value.bytes is not None:
                total_bytes = max(total_bytes, 0) + value.bytes
        stale = []
        for topic, seen in self._last_seen.items():
            if seen == number:
                continue
            if number - seen >= self.capacity:
                stale.append(topic)
            self._entries[topic][slot] = GAP
            self._bytes[topic][slot] = GAP
        for topic in stale:
            del self._entries[topic], self._bytes[topic], self._last_seen[topic]
        self._total_entries[slot] = total_entries if retained else GAP
        self._total_bytes[slot] = total_bytes
        self._next = (slot + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)
        self._recorded += 1

    def _ordered(self, ring: array[int]) -> list[int]:
        """`ring`'s held slots, oldest first."""
        start = (self._next - self._count) % self.capacity
        if start + self._count <= self.capacity:
            return ring[start : start + self._count].tolist()
        return ring[start:].tolist() + ring[: self._next].tolist()

    def _latest(self, topic: str) -> tuple[int, int]:
        if not self._count:
            return GAP, GAP
        slot = (self._next - 1) % self.capacity
        return self._bytes[topic][slot], self._entries[topic][slot]

    # -- purges --------------------------------------------------------------------------

    def add_purges(self, marks: Iterable[PurgeMark]) -> int:
        """Keep these purges (each procedure once), dropping the oldest over capacity;
        returns how many were new."""
        added = 0
        for mark in marks:
            if mark.procedure_id in self._marks:
                continue
            self._marks[mark.procedure_id] = mark
            bisect.insort(self._purges, (mark.at, mark.procedure_id))
            added += 1
        excess = len(self._purges) - self.purge_capacity
        if excess > 0:
            for _, pid in self._purges[:excess]:
                del self._marks[pid]
            del self._purges[:excess]
        return added

    def drop_purges_before(self, at: float) -> None:
        """Forget the purges that finished before `at`."""
        cut = bisect.bisect_left(self._purges, (at, ""))
        for _, pid in self._purges[:cut]:
            del self._marks[pid]
        del self._purges[:cut]

    # -- reading -------------------------------------------------------------------------

    def view(self, *, topics: Collection[str] | None = None, top: int | None = None) -> TrendView:
        """The samples of `topics` (default: every topic held), the `top` largest by their
        newest sample (bytes, then entries), with the totals and every purge kept."""
        names = [t for t in self._entries if topics is None or t in topics]
        names.sort(key=lambda t: (*(-v for v in self._latest(t)), t))
        if top is not None:
            names = names[:top]
        series = tuple(
            TopicSeries(
                topic=t,
                entries=tuple(_opt(v) for v in self._ordered(self._entries[t])),
                bytes=tuple(_opt(v) for v in self._ordered(self._bytes[t])),
            )
            for t in names
        )
        start = (self._next - self._count) % self.capacity
        times = [self._times[(start + i) % self.capacity] for i in range(self._count)]
        return TrendView(
            times=tuple(times),
            series=series,
            total_entries=tuple(_opt(v) for v in self._ordered(self._total_entries)),
            total_bytes=tuple(_opt(v) for v in self._ordered(self._total_bytes)),
            topics=len(self._entries),
            purges=tuple(self._marks[pid] for _, pid in self._purges),
        )
