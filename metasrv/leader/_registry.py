"""The leader's in-memory region and topic stats (DESIGN §4: never one kv write per heartbeat).

Region rows are columns (`StatTable`, private to this registry): a heartbeat is judged
against them (`judge`) and stores what was accepted through the verdict, overwriting its
regions' values in place; a snapshot is a copy of arrays, and `RegionStat` objects are
built only when read.
Topic stats keep the highest reported entry id and an average record size: the growth of the
cumulative `record_size`/`record_num` counters (each datanode counts on its own), summed
with exponentially decaying weights. State per (topic, datanode) is one pair of counters,
whatever the heartbeat rate or the run's length.
Everything here is lost on purpose when leadership changes (`clear()`, invariant 3).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from metasrv.leader._region_stats import (
    DirtyRows,
    RowColumns,
    StatRow,
    StatTable,
    TopicRows,
    Verdict,
)
from metasrv.model import RegionStat, TopicStat
from metasrv.wire import Columns

DEFAULT_WINDOW = 300.0
"""Time constant, in seconds, of the decay behind a topic's average record size: growth
that old weighs 1/e of growth now."""


@dataclass(slots=True)
class _TopicAccumulator:
    latest_entry_id: int = -1
    # Counter growth summed over datanodes, each term decayed by exp(-age / window);
    # `decayed_at` is when the sums were last brought up to date.
    size_growth: float = 0.0
    num_growth: float = 0.0
    decayed_at: float = 0.0
    size_total: int = 0  # latest counters summed over datanodes (the lifetime average)
    num_total: int = 0
    avg: float = 0.0
    received_at: float = 0.0
    nodes: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Datanode id -> its latest (record_size, record_num) counters for this topic."""


def _topic_stat(topic: str, acc: _TopicAccumulator) -> TopicStat:
    return TopicStat(
        topic=topic,
        latest_entry_id=acc.latest_entry_id,
        avg_record_size=acc.avg,
        received_at=acc.received_at,
    )


def row_of(stat: RegionStat) -> StatRow:
    """The stored form of a stat."""
    return StatRow(
        stat.node_id,
        stat.topic,
        stat.flushed_entry_id,
        stat.topic_latest_entry_id,
        stat.memtable_bytes,
        stat.manifest_version,
        stat.received_at,
        stat.prunable_entry_id,
    )


def stat_of(region_id: int, row: StatRow) -> RegionStat:
    """The `RegionStat` a stored row stands for."""
    return RegionStat(
        region_id,
        row.node_id,
        row.topic,
        row.flushed_entry_id,
        row.topic_latest_entry_id,
        row.memtable_bytes,
        row.manifest_version,
        row.received_at,
    )


class RegionRegistry:
    """Latest stat of every region and topic this leader has heard about.

    Region rows live in a `StatTable` (columns, each row under the topic it names): a
    heartbeat's columns are judged against them (`judge`) and stored through the
    verdict, and `topic_snapshot` gives a reader a copy of one topic's rows.
    """

    def __init__(self, *, window: float = DEFAULT_WINDOW) -> None:
        self.window = window
        self._table = StatTable()
        """The rows themselves; replaced by `clear()`."""
        self._topic_acc: dict[str, _TopicAccumulator] = {}

    # --- regions ---------------------------------------------------------------------

    def judge(self, node_id: int, cols: Columns) -> Verdict:
        """What the stored rows say of a heartbeat's regions (`StatTable.judge`); the
        verdict stores what its judge accepts, into this term's table."""
        return self._table.judge(node_id, cols)

    def dirty_rows(self, current: DirtyRows | None = None) -> DirtyRows:
        """`current` while it flags this term's rows, else a new, empty dirty set over
        them (the checkpointer's: `clear` gives the registry a new table)."""
        if current is not None and current.over(self._table):
            return current
        return DirtyRows(self._table)

    def row_slices(self, size: int) -> Iterator[RowColumns]:
        """Copies of every row, `size` slots' worth at a time, each taken when asked for
        (`StatTable.slices`: the stat history yields between them)."""
        return self._table.slices(size)

    def topics(self) -> list[str]:
        """Topics with at least one region row."""
        return self._table.topics()

    def get(self, region_id: int, topic: str | None = None) -> RegionStat | None:
        """The region's latest stat, or None if it has not reported to this leader.

        With `topic`, only a stat naming that topic counts.
        """
        row = self._table.get(region_id)
        if row is None or (topic is not None and row.topic != topic):
            return None
        return stat_of(region_id, row)

    def discard(self, region_id: int, topic: str | None = None) -> None:
        """Forget a region (removed from the map), whichever topic its row names."""
        del topic  # a region has one row, found by its id
        self._table.discard(region_id)

    def topic_snapshot(self, topic: str) -> TopicRows:
        """The latest stats naming `topic`, as of now: a copy of one topic's rows only
        (later heartbeats do not show)."""
        return self._table.snapshot(topic)

    def __contains__(self, region_id: object) -> bool:
        return region_id in self._table

    def __len__(self) -> int:
        return len(self._table)

    # --- topics ----------------------------------------------------------------------

    def report_topic(
        self,
        node_id: int,
        topic: str,
        latest_entry_id: int,
        record_size: int,
        record_num: int,
        now: float,
    ) -> None:
        """Record one datanode's view of a topic (every heartbeat, for every topic it uses)."""
        acc = self._topic_acc.get(topic)
        if acc is None:
            acc = self._topic_acc[topic] = _TopicAccumulator(decayed_at=now)
        if latest_entry_id > acc.latest_entry_id:
            acc.latest_entry_id = latest_entry_id
        acc.received_at = now

        last = acc.nodes.get(node_id)
        if last is not None and last[0] == record_size and last[1] == record_num:
            return  # no growth: the sums and the average stand (most reports, most topics)
        acc.nodes[node_id] = (record_size, record_num)
        if last is None:
            size_growth = num_growth = 0
        else:
            last_size, last_num = last
            acc.size_total -= last_size
            acc.num_total -= last_num
            size_growth = record_size - last_size
            num_growth = record_num - last_num
            if size_growth < 0 or num_growth < 0:
                # The datanode restarted and its counters began again: no growth to count.
                size_growth = num_growth = 0
        acc.size_total += record_size
        acc.num_total += record_num
        if num_growth > 0 or size_growth > 0:
            # Decay lazily: scaling by exp(-dt / window) now covers every report in between.
            decay = math.exp(-max(0.0, now - acc.decayed_at) / self.window)
            acc.size_growth = acc.size_growth * decay + size_growth
            acc.num_growth = acc.num_growth * decay + num_growth
            acc.decayed_at = now
        if acc.num_growth > 0:
            acc.avg = acc.size_growth / acc.num_growth
        elif acc.avg == 0.0 and acc.num_total > 0:
            # No growth seen yet: the lifetime average is the best estimate.
            acc.avg = acc.size_total / acc.num_total

    def topic_stat(self, topic: str) -> TopicStat | None:
        """The topic's latest stat, or None if no datanode reported it to this leader."""
        acc = self._topic_acc.get(topic)
        return None if acc is None else _topic_stat(topic, acc)

    def topic_stats(self) -> dict[str, TopicStat]:
        """Every reported topic's stat."""
        return {topic: _topic_stat(topic, acc) for topic, acc in self._topic_acc.items()}

    # --- leadership ------------------------------------------------------------------

    @property
    def untouched(self) -> bool:
        """Nothing reported since `clear`: no region row, no topic report (prepared slots
        at most)."""
        return len(self._table) == 0 and not self._topic_acc

    def reserve(self, regions: int) -> None:
        """Size the table for `regions` rows (the mapped regions, when leadership begins)."""
        self._table.reserve(regions)

    def prepare(self, topic_regions: Iterable[tuple[str, Iterable[int]]]) -> int:
        """A slot for every mapped region (topic, its region ids) before it reports, so
        a new term's first round is judged a column at a time (`StatTable.prepare`)."""
        return self._table.prepare(topic_regions)

    def clear(self) -> None:
        """Forget everything (on every leadership change, DESIGN §2 invariant 3)."""
        self._table = StatTable()
        self._topic_acc = {}
