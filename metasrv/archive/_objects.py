"""What the bucket's keys mean: the object key codec and which objects cover a range.

One archived object holds the WAL entries `first..last` (both included) of one topic's
partition 0, at `{prefix}{topic}/{first:020d}-{last:020d}.parquet` (DESIGN §8). The ids are
Kafka offsets, so zero-padding to 20 digits makes the bucket's lexical order the entries' order.
Any other key under the prefix is not an archived object: `parse_object_key` says so with
`InvalidArgument`, and listings skip it rather than guess.

Ranges may overlap (an archiver killed after its put and before its commit leaves a range
that the next one archives again, maybe with a different end), so readers take any chain of
objects that covers what they need: `covering` picks a shortest one, or names the first gap.
Pure functions; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from metasrv.errors import InvalidArgument

MAX_ENTRY_ID = 2**63 - 1
"""Largest Kafka offset (int64); 19 digits, so 20 always suffice."""

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_NAME = re.compile(r"^(?P<first>\d{20})-(?P<last>\d{20})\.parquet$")


@dataclass(frozen=True, order=True)
class ArchivedRange:
    """The entries `first_entry_id..last_entry_id` (both included) of one WAL topic, as one
    archived object holds them. Ordered by topic, then first, then last."""

    topic: str
    first_entry_id: int
    last_entry_id: int

    def __post_init__(self) -> None:
        if not _TOPIC.match(self.topic):
            raise InvalidArgument(f"not a Kafka topic name: {self.topic!r}")
        if not 0 <= self.first_entry_id <= self.last_entry_id <= MAX_ENTRY_ID:
            raise InvalidArgument(
                f"archived range {self.first_entry_id}..{self.last_entry_id} of {self.topic}: "
                f"need 0 <= first <= last <= {MAX_ENTRY_ID}"
            )

    @property
    def end(self) -> int:
        """One past the last entry: the range is [first_entry_id, end)."""
        return self.last_entry_id + 1

    def key(self, prefix: str) -> str:
        """This range's object key under `prefix` (`[wal.archive] prefix`)."""
        return (
            f"{topic_prefix(prefix, self.topic)}"
            f"{self.first_entry_id:020d}-{self.last_entry_id:020d}.parquet"
        )


def topic_prefix(prefix: str, topic: str) -> str:
    """The key prefix every archived object of `topic` starts with."""
    if not _TOPIC.match(topic):
        raise InvalidArgument(f"not a Kafka topic name: {topic!r}")
    return f"{prefix}{topic}/"


def parse_object_key(prefix: str, key: str) -> ArchivedRange:
    """The range an archived object's key names; `InvalidArgument` for any other key."""
    if not key.startswith(prefix):
        raise InvalidArgument(f"object key {key!r} is not under the prefix {prefix!r}")
    topic, slash, name = key[len(prefix) :].partition("/")
    match = _NAME.match(name)
    if not slash or match is None or not _TOPIC.match(topic):
        raise InvalidArgument(
            f"object key {key!r} is not {prefix}<topic>/<first:020d>-<last:020d>.parquet"
        )
    return ArchivedRange(topic, int(match["first"]), int(match["last"]))


@dataclass(frozen=True)
class Coverage:
    """What `covering` found: the chain of objects, or the first entries none holds."""

    objects: tuple[ArchivedRange, ...]
    """A shortest chain covering [start, end) in entry order; () when there is a gap (or
    nothing to cover)."""
    gap: tuple[int, int] | None = None
    """[gap_start, gap_end): the first entries of [start, end) that no object holds; None
    when covered. gap_end is where the next object starts, or `end`."""

    @property
    def covered(self) -> bool:
        return self.gap is None


def covering(objects: Iterable[ArchivedRange], start: int, end: int) -> Coverage:
    """The objects (of one topic) that together hold every entry of [start, end) with no gap,
    as a shortest chain in entry order; or the first gap.

    Greedy over the objects sorted by first entry: at each step take, of the objects that
    begin at or before the next entry still needed, the one reaching furthest. That is the
    classic optimal interval cover; ties go to the object starting latest (the smaller one).
    """
    ranges = sorted(objects, key=lambda r: r.first_entry_id)
    if len({r.topic for r in ranges}) > 1:
        raise InvalidArgument("covering takes the objects of one topic")
    chain: list[ArchivedRange] = []
    pos, i = start, 0
    while pos < end:
        best: ArchivedRange | None = None
        while i < len(ranges) and ranges[i].first_entry_id <= pos:
            if best is None or ranges[i].end >= best.end:
                best = ranges[i]
            i += 1
        # Objects scanned in earlier steps ended at or before `pos` (else they would have
        # been chosen then), so only the newly scanned ones can reach past it.
        if best is None or best.end <= pos:
            gap_end = ranges[i].first_entry_id if i < len(ranges) else end
            return Coverage((), (pos, min(gap_end, end)))
        chain.append(best)
        pos = best.end
    return Coverage(tuple(chain))
