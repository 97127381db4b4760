"""The model's world: one WAL topic in Kafka, its regions, the kv store and the leader.

A state is a tree of named tuples (hashable, compared by value), so the search dedupes
states by hash. Entry ids are Kafka offsets of the topic's current incarnation (`inc`:
a topic deleted and recreated is a new incarnation whose offsets start again at 0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from metasrv import keys

ABSENT = -99
"""A route (kv or the leader's map) that does not exist; None is a route without a
checkpoint."""
ERROR = -98
"""A replay-start answered with an error."""

NEW, LIVE, GONE = 0, 1, 2
"""A region's life: not registered yet, registered (it writes), deregistered."""

FOREIGN = 0
"""The writer of a record another producer appended (needed by no region)."""

TOPIC = "wal_0"


def topic_id(inc: int) -> str:
    """Kafka's id of the topic's incarnation `inc`."""
    return f"00000000-0000-0000-0000-{inc:012d}"


class Region(NamedTuple):
    phase: int
    """NEW, LIVE or GONE."""
    mem: tuple[tuple[int, int], ...]
    """Unflushed entries it wrote, (incarnation, offset), oldest first."""
    flushed: int
    """Its true `flushed_entry_id` (the last entry it flushed, in the numbering it saw)."""
    claim: int | None
    """The topic's latest entry id when it last saw its memtable empty (an idle claim)."""
    replay: int | None
    """While restarting: the replay start answered (ERROR: an error); None otherwise."""
    lost: tuple[tuple[int, int], ...]
    """While restarting: the unflushed entries its restart must replay."""


class Kafka(NamedTuple):
    inc: int
    log_start: int
    owners: tuple[int, ...]
    """The writer of each offset of the current incarnation (the high watermark is its
    length); FOREIGN for records no region wrote."""
    purged: int = 0
    """The offset metasrv's own DeleteRecords moved the log start to (the rest of the
    log start's moves are someone else's)."""
    committed: int | None = None
    """The pinned consumer group's committed offset (the next entry it reads; None: it has
    committed none). Only moves forward."""
    archived: int = 0
    """The WAL archive's bucket (DESIGN §8): bit n set when an object holds offset n of the
    current incarnation. Objects are only added (no retention in the model)."""

    @property
    def hwm(self) -> int:
        return len(self.owners)


class Record(NamedTuple):
    """The purge's persisted procedure record (a non-terminal one holds the topic's lock)."""

    step: str
    """prepare, flush or purge."""
    prune_point: int | None
    target: int | None
    """The purge step's persisted intent."""
    topic_id: str | None = None
    """Kafka's topic id the prepare step planned on (`PurgeData.topic_id`)."""


class Task(NamedTuple):
    """The current leader's run of the record: where in its step it is."""

    phase: str
    """The record's step, or inside the purge step: `cas` (marker write in flight),
    `deleting` (DeleteRecords in flight), and with DELETE_BEFORE_MARKER `deleting_first`."""
    target: int | None = None
    log_start: int | None = None
    """Kafka's log start the purge step read before its marker write."""
    inc: int | None = None
    """The topic incarnation whose offsets the step read (its DeleteRecords is meant for
    it)."""


Stat = tuple[int, int | None]
"""A stored stat: (flushed_entry_id, topic_latest_entry_id or None)."""


class State(NamedTuple):
    term: int
    kafka: Kafka
    outside: int
    """Moves of Kafka's offsets by something else so far (retention, another producer)."""
    resets: int
    """Times the topic was deleted and recreated so far."""
    regions: tuple[Region, ...]
    marker: bytes | None
    """The kv marker value (`__topic_name/kafka/{topic}`), through the real codec."""
    routes: tuple[int | None, ...]
    """Per region, the kv route's checkpoint (ABSENT: no route)."""
    record: Record | None
    stats: tuple[Stat | None, ...]
    """The leader's in-memory stats (dropped at every leader change)."""
    lmap: tuple[int | None, ...]
    """The leader's topic-region map: per region its checkpoint, ABSENT when unmapped."""
    task: Task | None
    pending: frozenset[tuple[object, ...]]
    """Writes in flight, landing at any later time: ("cas", term, valid, value, target)
    (`valid`: the marker has not changed since the CAS read it: its revision compare holds),
    ("route", term, region index, checkpoint), ("del", term, offset, incarnation sent for,
    whether the leader that sent it had the consumer group pinned)."""
    pinned: bool = False
    """The leader's settings pin the consumer group (`[wal] pin_consumer_groups`)."""


class Variant(enum.Flag):
    """Known-bad protocols the search must catch (evidence that it can fail)."""

    NONE = 0
    DELETE_BEFORE_MARKER = enum.auto()
    """DeleteRecords before the marker write."""
    UNFENCED_CHECKPOINT = enum.auto()
    """A checkpoint (route) write lands whatever the leader's term (ef11397's batch_put)."""
    STALE_MAP_AT_TAKEOVER = enum.auto()
    """A new leader's map may miss a route the kv holds (a warm follower behind)."""
    NO_TOPIC_RESET_CHECK = enum.auto()
    """The planner as of ef11397, without the topic-reset check."""
    ORPHAN_ON_UNKNOWN_CREATE = enum.auto()
    """A procedure create whose outcome is unknown is not read back (ef11397's store)."""
    UNIDENTIFIED_REGISTRATION = enum.auto()
    """A registration records no Kafka topic id in the marker (ef11397: only a purge's
    advance did), so a topic recreated before its first purge is not a reset."""
    IGNORE_PIN = enum.auto()
    """The purge plans without the pinned consumer group's committed offset."""
    STALE_PIN_AT_PURGE = enum.auto()
    """The purge step does not read the pinned group again: it keeps the target persisted
    before (by a leader without the pin, on a resume)."""
    NO_ARCHIVE_CHECK = enum.auto()
    """The purge deletes without listing the bucket: the archive's pinned group is its only
    guard (as before the coverage check)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """How big the world is."""

    regions: int = 2
    max_hwm: int = 3
    """Records per incarnation of the topic."""
    max_terms: int = 3
    """Leader terms (2 leader changes)."""
    outside_moves: int = 1
    """Moves of the log start or high watermark by something else."""
    resets: int = 1
    """Deletions and recreations of the topic."""
    replay: bool = True
    """Regions restart, ask replay-start and replay."""
    checkpoints: bool = True
    """The leader writes checkpoints (route values)."""
    registration: bool = True
    """The second region starts unregistered; regions are registered and deregistered."""
    claims: bool = True
    """Idle regions report the topic's latest entry id (`topic_latest_entry_id`)."""
    reports_while_restarting: bool = True
    """A restarting region is reported (its flushed id, no idle claim) before it has
    replayed."""
    late_delete_across_reset: bool = False
    """A DeleteRecords in flight when the topic is deleted may land on the recreated
    topic (Kafka's DeleteRecords names the topic, not its id: nothing metasrv can fence;
    off by default, see the package docstring)."""
    recreate_during_purge_only: bool = False
    """The topic is deleted and recreated only while a purge runs past its prepare step."""
    partial_reports: bool = True
    """A heartbeat may carry any flushed id between the stored one and the truth (a
    delayed or reordered one); otherwise only the truth."""
    consumer: bool = False
    """A consumer group reads the topic and commits offsets, only forward; pinned from
    the start (`pin_later` False) or from a leader change on."""
    pin_later: bool = False
    """The group is pinned only by the settings of a later leader (a configuration
    change rolled out with a restart): a purge planned without it is resumed with it."""
    archive: bool = False
    """The WAL archive is enabled: archivers write objects of any range Kafka holds, at any
    time and independently of the (pinned) group's commits, whose word is not the bucket
    (an offset reset or moved by a tool, a group shared by another bucket); the purge step
    checks the bucket before it deletes."""

    def describe(self) -> str:
        return (
            f"{self.regions} regions, 1 topic, high watermark <= {self.max_hwm}, "
            f"{self.max_terms} leader terms, {self.outside_moves} outside offset move(s), "
            f"{self.resets} topic recreation(s)"
        )


SMALL: dict[str, Bounds] = {
    # Purges, leader changes and late writes, registration and deregistration.
    "purge": Bounds(max_hwm=3, max_terms=3, outside_moves=0, resets=0, replay=False,
                    checkpoints=False, claims=False),
    # Idle claims with registration, over fewer records.
    "idle": Bounds(max_hwm=2, max_terms=2, outside_moves=0, resets=0, replay=False,
                   checkpoints=False),
    # Restarts, replay-start and replays, checkpoints, leader changes.
    "replay": Bounds(max_hwm=2, max_terms=3, outside_moves=0, resets=0, checkpoints=True,
                     claims=False, registration=False),
    # Kafka moved by something else: retention, another producer, a recreation.
    "kafka": Bounds(regions=1, max_hwm=2, max_terms=2, outside_moves=1, resets=1,
                    checkpoints=False, claims=False, registration=False),
    # A pinned consumer group committing forward (DESIGN §8), pinned from the start.
    "pinned": Bounds(regions=2, max_hwm=3, max_terms=2, outside_moves=0, resets=0,
                     replay=False, checkpoints=False, claims=False, consumer=True),
    # The WAL archive enabled: objects written at any time, the archive's group pinned.
    "archive": Bounds(regions=1, max_hwm=3, max_terms=3, outside_moves=0, resets=0,
                      replay=False, checkpoints=False, claims=False, registration=False,
                      consumer=True, archive=True),
}  # fmt: skip
"""The bounds `make test` searches, one world each (their union in one world is too big
for two minutes on two cores)."""

PIN_LATER = Bounds(regions=1, max_hwm=3, max_terms=3, outside_moves=0, resets=0,
                   replay=False, checkpoints=False, claims=False, registration=False,
                   consumer=True, pin_later=True)  # fmt: skip
"""The consumer group pinned by a later leader's settings: purges planned before resume
under the pin."""

LARGE: dict[str, Bounds] = {
    "purge": Bounds(max_hwm=4, max_terms=3, outside_moves=0, resets=0, replay=False,
                    checkpoints=False, claims=False),
    "idle": Bounds(max_hwm=3, max_terms=2, outside_moves=0, resets=0, replay=False,
                   checkpoints=False),
    "replay": Bounds(max_hwm=3, max_terms=2, outside_moves=0, resets=0, checkpoints=True,
                     claims=False, registration=False),
    "kafka": Bounds(regions=2, max_hwm=3, max_terms=2, outside_moves=1, resets=1,
                    checkpoints=False, claims=False, registration=False),
}  # fmt: skip
"""Larger bounds: the slow test and `benchmarks/protocol_model.py --bound large`."""

IDLE_REPLAY = Bounds(max_hwm=2, max_terms=2, outside_moves=0, resets=0, checkpoints=False,
                     registration=False)  # fmt: skip
"""Idle claims with restarts: where a report lowers a region's prunable id under a purge."""


def initial(bounds: Bounds, variant: Variant = Variant.NONE) -> State:
    """Region 0 registered and live; the others not registered yet (or all registered
    when the bounds leave registration out); term 1 leads with its map loaded. The
    registrations recorded the topic's id in the marker (`keys.registered_marker`)."""
    n = bounds.regions
    phases = [LIVE] + [NEW if bounds.registration else LIVE] * (n - 1)
    regions = tuple(Region(p, (), -1, None, None, ()) for p in phases)
    routes = tuple(None if p == LIVE else ABSENT for p in phases)
    return State(
        term=1,
        kafka=Kafka(0, 0, (), 0),
        outside=0,
        resets=0,
        regions=regions,
        marker=None if Variant.UNIDENTIFIED_REGISTRATION in variant else registered(None, 0),
        routes=routes,
        record=None,
        stats=(None,) * n,
        lmap=routes,
        task=None,
        pending=frozenset(),
        pinned=bounds.consumer and not bounds.pin_later,
    )


def registered(marker: bytes | None, inc: int) -> bytes | None:
    """The marker value a registration on incarnation `inc` writes (None: none to write)."""
    found = None if marker is None else keys.decode_marker(marker)
    new = keys.registered_marker(found, topic_id(inc))
    return None if new is None else keys.encode_marker(new, marker)
