"""The leader's in-memory region and topic stats (DESIGN §4: never one kv write per heartbeat).

Heartbeats overwrite a region's `RegionStat` in one dict store, so ingest is O(1) per
region and a snapshot is a dict copy. Topic stats keep the highest reported entry id and
an average record size computed from the cumulative `record_size`/`record_num` counters'
growth over a sliding window, per reporting datanode (each datanode counts on its own).
Everything here is lost on purpose when leadership changes (`clear()`, invariant 3).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from metasrv.model import RegionStat, TopicStat

DEFAULT_WINDOW = 300.0
"""Seconds of counter history behind a topic's average record size."""

_MAX_SAMPLES = 512
"""Counter samples kept per (topic, datanode); bounds memory whatever the heartbeat rate."""


@dataclass(frozen=True, slots=True)
class DatanodeInfo:
    """The last heartbeat of one datanode."""

    node_id: int
    """Datanode id."""
    addr: str | None
    """Address it reported, if any."""
    last_seen: float
    """Monotonic-clock time of its last accepted heartbeat."""


@dataclass(slots=True)
class _CounterWindow:
    """One datanode's cumulative counters for one topic over the window."""

    samples: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque(maxlen=_MAX_SAMPLES)
    )
    size_delta: int = 0
    num_delta: int = 0


@dataclass(slots=True)
class _TopicAccumulator:
    latest_entry_id: int = -1
    size_delta: int = 0
    num_delta: int = 0
    size_total: int = 0
    num_total: int = 0
    avg: float = 0.0
    nodes: dict[int, _CounterWindow] = field(default_factory=dict)


class RegionRegistry:
    """Latest stat of every region and topic this leader has heard about."""

    def __init__(self, *, window: float = DEFAULT_WINDOW) -> None:
        self.window = window
        self._stats: dict[int, RegionStat] = {}
        self._topic_acc: dict[str, _TopicAccumulator] = {}
        self._topic_stats: dict[str, TopicStat] = {}
        self._nodes: dict[int, DatanodeInfo] = {}
        self.generation = 0
        """Bumped by `clear()`; lets holders of a snapshot see that it predates a leader change."""

    # --- regions ---------------------------------------------------------------------

    def update(self, stats: Iterable[RegionStat]) -> None:
        """Store each stat as its region's latest (callers have validated ordering)."""
        store = self._stats
        for stat in stats:
            store[stat.region_id] = stat

    def update_many(self, batch: Mapping[int, RegionStat]) -> None:
        """Store a heartbeat's accepted stats keyed by region id (one C-level dict update)."""
        self._stats.update(batch)

    def get(self, region_id: int) -> RegionStat | None:
        """The region's latest stat, or None if it has not reported to this leader."""
        return self._stats.get(region_id)

    def discard(self, region_id: int) -> None:
        """Forget a region (deregistered)."""
        self._stats.pop(region_id, None)

    def snapshot(self) -> dict[int, RegionStat]:
        """A copy of every region's latest stat (stats are immutable; the copy is shallow)."""
        return dict(self._stats)

    def view(self) -> Mapping[int, RegionStat]:
        """A read-only live view (no copy); do not hold it across an `await`."""
        return MappingProxyType(self._stats)

    def __len__(self) -> int:
        return len(self._stats)

    # --- topics ----------------------------------------------------------------------

    def report_topic(
        self,
        node_id: int,
        topic: str,
        latest_entry_id: int,
        record_size: int,
        record_num: int,
        now: float,
    ) -> TopicStat:
        """Record one datanode's view of a topic; returns the topic's updated stat."""
        acc = self._topic_acc.get(topic)
        if acc is None:
            acc = self._topic_acc[topic] = _TopicAccumulator()
        if latest_entry_id > acc.latest_entry_id:
            acc.latest_entry_id = latest_entry_id

        win = acc.nodes.get(node_id)
        if win is None:
            win = acc.nodes[node_id] = _CounterWindow()
        samples = win.samples
        if samples:
            _, last_size, last_num = samples[-1]
            acc.size_total -= last_size
            acc.num_total -= last_num
            if record_size < last_size or record_num < last_num:
                # The datanode restarted and its counters began again: start a new window.
                samples.clear()
        samples.append((now, record_size, record_num))
        acc.size_total += record_size
        acc.num_total += record_num
        horizon = now - self.window
        while len(samples) > 1 and samples[0][0] < horizon:
            samples.popleft()
        _, first_size, first_num = samples[0]
        size_delta = record_size - first_size
        num_delta = record_num - first_num
        # Keep the per-topic sums incremental: a topic may be reported by many datanodes
        # in every heartbeat, and recomputing over all of them would be O(nodes).
        acc.size_delta += size_delta - win.size_delta
        acc.num_delta += num_delta - win.num_delta
        win.size_delta = size_delta
        win.num_delta = num_delta

        if acc.num_delta > 0:
            acc.avg = acc.size_delta / acc.num_delta
        elif acc.avg == 0.0 and acc.num_total > 0:
            # No growth in the window yet: the lifetime average is the best estimate.
            acc.avg = acc.size_total / acc.num_total

        stat = TopicStat(
            topic=topic,
            latest_entry_id=acc.latest_entry_id,
            avg_record_size=acc.avg,
            received_at=now,
        )
        self._topic_stats[topic] = stat
        return stat

    def topic_stat(self, topic: str) -> TopicStat | None:
        """The topic's latest stat, or None if no datanode reported it to this leader."""
        return self._topic_stats.get(topic)

    def topic_stats(self) -> dict[str, TopicStat]:
        """Every reported topic's stat."""
        return dict(self._topic_stats)

    # --- datanodes -------------------------------------------------------------------

    def note_node(self, node_id: int, addr: str | None, now: float) -> None:
        """Remember a datanode's address and when it last sent a heartbeat."""
        self._nodes[node_id] = DatanodeInfo(node_id=node_id, addr=addr, last_seen=now)

    def nodes(self) -> dict[int, DatanodeInfo]:
        """Every datanode heard from since the last `clear()`."""
        return dict(self._nodes)

    # --- leadership ------------------------------------------------------------------

    def clear(self) -> None:
        """Forget everything (on every leadership change, DESIGN §2 invariant 3)."""
        self._stats = {}
        self._topic_acc = {}
        self._topic_stats = {}
        self._nodes = {}
        self.generation += 1
