"""The region stat history: what the leader heard from datanodes, kept as Parquet.

The reconcile job (metasrv/reconcile) reads it to tell which mapped regions stopped
reporting, which report a topic other than their mapped one, and which report without
being mapped. The leader records it; nothing in the purge path reads it.

Layout under a cluster's history directory (`metasrv.stat_history.cluster_root`: every
leader of the cluster writes there, so a history survives failover), a Hive-partitioned
dataset Spark or pyarrow reads on any filesystem pyarrow writes (local, shared mount,
s3://, hdfs://):

    stats/hour=YYYYMMDDHH/writer={node}/snap-{epoch_ms}.parquet      one row per stat
    snapshots/hour=YYYYMMDDHH/writer={node}/snap-{epoch_ms}.parquet  one row per snapshot

`stats` rows (`STATS_SCHEMA`): `ts` (snapshot time, UTC), `seen_at` (wall-clock time the
leader received the stat), `region_id`, `node_id`, `topic` (the topic the region
*reported*), `flushed_entry_id`, `topic_latest_entry_id`, `prunable_entry_id`,
`memtable_bytes`, `manifest_version`, `accepted` (false for a report the heartbeat
handler rejected: unknown region or wrong topic, see `record_rejected`).

Only stats received since the previous snapshot are written, so a region that keeps
heartbeating appears once per interval and a dead one stops appearing (its last row
keeps its `seen_at`). `snapshots` rows (`SNAPSHOTS_SCHEMA`: `ts`, `regions`, `written`)
are written even when no stat changed, so a reader can tell "no region reported" from
"nobody was recording". Hour partitions older than the retention are deleted by the
writer (any leader deletes any writer's old hours). On local and HDFS paths files are
written under a dot-name and renamed; object stores publish an object whole. Either way
readers never see half a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from metasrv.leader import NULL, RegionRegistry, RowColumns, columns_of_rows, row_of
from metasrv.model import RegionStat
from metasrv.process import ErrorSink, PeriodicLoop, log_only
from metasrv.stat_history._location import open_location, writer_partition

logger = logging.getLogger(__name__)

STATS_DIR = "stats"
"""Sub-directory holding the per-region stat rows."""
SNAPSHOTS_DIR = "snapshots"
"""Sub-directory holding one row per snapshot (the coverage record)."""
PARTITION = "hour"
"""Hive partition column: the snapshot's UTC hour as an int `YYYYMMDDHH`."""

_TS = pa.timestamp("ms", tz="UTC")

STATS_SCHEMA = pa.schema(
    [
        pa.field("ts", _TS, nullable=False),
        pa.field("seen_at", _TS, nullable=False),
        pa.field("region_id", pa.int64(), nullable=False),
        pa.field("node_id", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("flushed_entry_id", pa.int64(), nullable=False),
        pa.field("topic_latest_entry_id", pa.int64()),
        pa.field("prunable_entry_id", pa.int64(), nullable=False),
        pa.field("memtable_bytes", pa.int64(), nullable=False),
        pa.field("manifest_version", pa.int64()),
        pa.field("accepted", pa.bool_(), nullable=False),
    ]
)
"""Columns of a `stats` file (the partition column `hour` comes from the path)."""

SNAPSHOTS_SCHEMA = pa.schema(
    [
        pa.field("ts", _TS, nullable=False),
        pa.field("regions", pa.int64(), nullable=False),
        pa.field("written", pa.int64(), nullable=False),
    ]
)
"""Columns of a `snapshots` file."""

DEFAULT_RETENTION = 7 * 86400.0
"""Seconds of history kept by default."""

_MAX_REJECTED = 100_000
"""Rejected reports buffered between two snapshots (latest per region); a flood is cut."""


def hour_partition(epoch_s: float) -> int:
    """The `hour` partition value (`YYYYMMDDHH`, UTC) of a wall-clock time."""
    t = datetime.fromtimestamp(epoch_s, UTC)
    return ((t.year * 100 + t.month) * 100 + t.day) * 100 + t.hour


def columns_table(
    cols: RowColumns,
    now: float,
    mono_now: float,
    *,
    accepted: bool = True,
) -> pa.Table:
    """Rows of `STATS_SCHEMA` for `cols`, taken at wall-clock `now`, a column at a time.

    `received` is monotonic; it becomes wall-clock `seen_at` through the pair (`now`,
    `mono_now`) read at the same instant.
    """
    n = len(cols)
    if n == 0:
        return STATS_SCHEMA.empty_table()
    offset_ms = (now - mono_now) * 1000
    names = pa.array(cols.names, pa.string())
    columns = {
        "ts": pa.array(np.full(n, int(now * 1000), np.int64), _TS),
        "seen_at": pa.array((cols.received * 1000 + offset_ms).astype(np.int64), _TS),
        "region_id": pa.array(cols.ids, pa.int64()),
        "node_id": pa.array(cols.node, pa.int64()),
        "topic": pa.DictionaryArray.from_arrays(pa.array(cols.topic, pa.int32()), names).cast(
            pa.string()
        ),
        "flushed_entry_id": pa.array(cols.flushed, pa.int64()),
        "topic_latest_entry_id": pa.array(cols.latest, pa.int64(), mask=cols.latest == NULL),
        "prunable_entry_id": pa.array(cols.prunable, pa.int64()),
        "memtable_bytes": pa.array(cols.memtable, pa.int64()),
        "manifest_version": pa.array(cols.manifest, pa.int64(), mask=cols.manifest == NULL),
        "accepted": pa.array(np.full(n, accepted), pa.bool_()),
    }
    return pa.Table.from_arrays([columns[f.name] for f in STATS_SCHEMA], schema=STATS_SCHEMA)


def stats_columns(stats: Iterable[RegionStat]) -> RowColumns:
    """Stats as columns (tools, tests and rejected reports: not the periodic pass)."""
    listed = list(stats)  # distinct regions: a mapping's values, or one report each
    return columns_of_rows([stat.region_id for stat in listed], list(map(row_of, listed)))


SLICE_SLOTS = 65_536
"""Registry slots a periodic pass copies between two yields to the event loop (~1 ms)."""

_Seen = tuple[np.ndarray, np.ndarray]
"""Region ids (sorted) and the `received_at` written for each."""

_NOTHING_SEEN: _Seen = (np.zeros(0, np.int64), np.zeros(0, np.float64))


class _ChangedRows:
    """The rows received since the previous snapshot, gathered a slice at a time.

    `previous` holds the region ids and `received_at` values written last time; a row
    whose `received_at` differs (or a region not in it) is new. What is kept between
    slices is column copies; the Arrow tables are built by `tables()` on the writer's
    thread.
    """

    def __init__(self, previous: _Seen, now: float, mono_now: float) -> None:
        self._previous = previous
        self._seen: list[RowColumns] = []
        self._parts: list[tuple[RowColumns, bool]] = []
        self.now = now
        self.mono_now = mono_now
        self.written = 0

    def add(self, cols: RowColumns) -> None:
        self._seen.append(cols)
        prev_ids, prev_received = self._previous
        changed = np.ones(len(cols), bool)
        if len(prev_ids) and len(cols):
            at = np.minimum(np.searchsorted(prev_ids, cols.ids), len(prev_ids) - 1)
            changed = (prev_ids[at] != cols.ids) | (prev_received[at] != cols.received)
        if changed.any():
            kept = cols if changed.all() else cols.where(changed)
            self._parts.append((kept, True))
            self.written += len(kept)

    def add_rejected(self, stats: Sequence[RegionStat]) -> None:
        if stats:
            self._parts.append((stats_columns(stats), False))
            self.written += len(stats)

    def seen(self) -> _Seen:
        """The ids and `received_at` of every row added, for the next pass to compare."""
        if not self._seen:
            return _NOTHING_SEEN
        ids = np.concatenate([c.ids for c in self._seen])
        received = np.concatenate([c.received for c in self._seen])
        order = np.argsort(ids, kind="stable")
        return ids[order], received[order]

    def tables(self) -> list[pa.Table]:
        return [
            columns_table(cols, self.now, self.mono_now, accepted=accepted)
            for cols, accepted in self._parts
        ]


def _write_whole(fs: pafs.FileSystem, table: pa.Table, directory: str, name: str) -> None:
    fs.create_dir(directory, recursive=True)
    path = f"{directory}/{name}"
    if fs.type_name in ("local", "hdfs"):
        # Readers skip dot-files; the rename publishes the whole file at once.
        tmp = f"{directory}/.{name}.tmp"
        pq.write_table(table, tmp, compression="zstd", filesystem=fs)
        fs.move(tmp, path)
    else:
        pq.write_table(table, path, compression="zstd", filesystem=fs)


class StatHistoryWriter(PeriodicLoop):
    """Writes the leader's region stats to the history directory every `interval` seconds.

    `directory` is the cluster's history root (a path or URL, see
    `metasrv.stat_history.cluster_root`); `writer` names this metasrv node in the file layout.
    `source` returns the registry whose live rows are read (`RegionRegistry.row_slices`);
    give one that returns None while this process is not the leader, since a follower's
    view is empty or outdated. `write_snapshot` writes a given snapshot at once (tests, tools).

    The periodic pass never holds the event loop for long: it copies the table's columns
    on the loop `SLICE_SLOTS` slots at a time (whole-array copies, ~1 ms each), yielding
    between slices, and the comparison with the previous pass is a sort and a search
    over arrays. The Arrow tables, the Parquet encoding and the file writes run on a
    worker thread. No object is built per region: the rows built one by one (~1 s of
    Python work a minute at a million regions) were a stall of every heartbeat.

    The periodic pass is a loop on the ticker (`PeriodicLoop`); `stop` lets a write in
    progress finish.
    """

    task_name = "stat-history-writer"
    stop_grace = math.inf

    def __init__(
        self,
        directory: str | Path,
        interval: float,
        source: Callable[[], RegionRegistry | None] | None = None,
        *,
        retention: float = DEFAULT_RETENTION,
        on_error: ErrorSink | None = None,
        writer: str = "metasrv",
        slice_slots: int = SLICE_SLOTS,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if retention < interval:
            raise ValueError("retention must be at least one interval")
        super().__init__(on_error or log_only("stat_history"))
        self.directory = str(directory).rstrip("/")
        self._slice_slots = slice_slots
        self._fs, self._root = open_location(self.directory)
        self._writer = writer_partition(writer)
        self.interval = interval
        self.retention = retention
        self._source = source
        self._written: _Seen = _NOTHING_SEEN
        self._rejected: dict[int, RegionStat] = {}

    def record_rejected(self, stats: Iterable[RegionStat]) -> None:
        """Keep reports the heartbeat handler rejected; the next snapshot writes them.

        Without them the history cannot show a region that reports while unmapped, or
        on a topic other than its mapped one (the handler stores nothing for those).
        """
        for stat in stats:
            if len(self._rejected) >= _MAX_REJECTED and stat.region_id not in self._rejected:
                continue
            self._rejected[stat.region_id] = stat

    def write_snapshot(
        self,
        snapshot: Mapping[int, RegionStat],
        now: float,
        mono_now: float | None = None,
    ) -> int:
        """Append the stats received since the last call; return how many rows were written.

        `now` is wall-clock epoch seconds; `mono_now` the matching `time.monotonic()`
        (read now when omitted). Also prunes hour partitions older than the retention.
        """
        mono = time.monotonic() if mono_now is None else mono_now
        changes = _ChangedRows(self._written, now, mono)
        changes.add(stats_columns(snapshot.values()))
        changes.add_rejected(self._take_rejected())
        return self._write(changes)

    async def record(self) -> int:
        """One periodic pass over the source's live rows; returns the rows written."""
        assert self._source is not None
        changes = _ChangedRows(self._written, time.time(), time.monotonic())
        registry = self._source()
        if registry is not None:
            # Each slice is copied whole between two yields, so no row is seen half
            # updated; a heartbeat arriving between slices is written now or next pass.
            for columns in registry.row_slices(self._slice_slots):
                changes.add(columns)
                await asyncio.sleep(0)
        rejected = self._take_rejected()
        for start in range(0, len(rejected), self._slice_slots):
            changes.add_rejected(rejected[start : start + self._slice_slots])
            await asyncio.sleep(0)
        return await asyncio.to_thread(self._write, changes)

    def _take_rejected(self) -> list[RegionStat]:
        rejected = list(self._rejected.values())
        self._rejected.clear()
        return rejected

    def _write(self, changes: _ChangedRows) -> int:
        """Write the gathered rows and the snapshot's coverage row; prune old hours."""
        now = changes.now
        seen = changes.seen()
        hour = f"{PARTITION}={hour_partition(now)}"
        name = f"snap-{int(now * 1000)}.parquet"
        tables = changes.tables()
        if tables:
            stats_dir = f"{self._root}/{STATS_DIR}/{hour}/{self._writer}"
            _write_whole(self._fs, pa.concat_tables(tables), stats_dir, name)
        marker = pa.Table.from_pydict(
            {
                "ts": [int(now * 1000)],
                "regions": [len(seen[0])],
                "written": [changes.written],
            },
            schema=SNAPSHOTS_SCHEMA,
        )
        marker_dir = f"{self._root}/{SNAPSHOTS_DIR}/{hour}/{self._writer}"
        _write_whole(self._fs, marker, marker_dir, name)
        # Regions gone from the registry are forgotten, so the map does not grow unbounded.
        self._written = seen
        self.prune(now)
        return changes.written

    def prune(self, now: float) -> int:
        """Delete hour partitions wholly older than the retention; return how many."""
        oldest_kept = hour_partition(now - self.retention)
        removed = 0
        for sub in (STATS_DIR, SNAPSHOTS_DIR):
            listing = pafs.FileSelector(f"{self._root}/{sub}", allow_not_found=True)
            for part in self._fs.get_file_info(listing):
                name, _, value = part.base_name.partition("=")
                if name == PARTITION and value.isdigit() and int(value) < oldest_kept:
                    # Another leader may be deleting the same hour: gone is gone.
                    with contextlib.suppress(FileNotFoundError):
                        self._fs.delete_dir(part.path)
                    removed += 1
        return removed

    async def start(self) -> None:
        """Start the periodic writer task (needs a `source`)."""
        if self._source is None:
            raise ValueError("StatHistoryWriter.start needs a snapshot source")
        await super().start()

    def next_round_in(self) -> float:
        return self.interval

    async def round(self) -> None:
        # A full or unwritable disk, or a value the history cannot hold, must not take
        # the leader down or stop the history; the reconcile job sees the gap in
        # `snapshots` and skips the staleness check. Logged and counted (`on_error`).
        written = await self.record()
        logger.debug("stat history written", extra={"rows": written})
