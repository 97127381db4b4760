"""The region stat history: what the leader heard from datanodes, kept as Parquet.

The reconcile job (metasrv/reconcile) reads it to tell which mapped regions stopped
reporting, which report a topic other than their mapped one, and which report without
being mapped. The leader records it; nothing in the purge path reads it.

Layout under a cluster's history directory (`metasrv.stat_location.cluster_root`: every
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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from metasrv.background import ErrorSink, log_only
from metasrv.model import RegionStat
from metasrv.registry import StatRow, StatSnapshot, row_of
from metasrv.stat_location import open_location, writer_partition

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

_NO_ROWS: Mapping[int, StatRow] = {}

_MAX_REJECTED = 100_000
"""Rejected reports buffered between two snapshots (latest per region); a flood is cut."""


def hour_partition(epoch_s: float) -> int:
    """The `hour` partition value (`YYYYMMDDHH`, UTC) of a wall-clock time."""
    t = datetime.fromtimestamp(epoch_s, UTC)
    return ((t.year * 100 + t.month) * 100 + t.day) * 100 + t.hour


def stats_table(
    stats: Iterable[RegionStat],
    now: float,
    mono_now: float,
    *,
    accepted: bool = True,
) -> pa.Table:
    """Rows of `STATS_SCHEMA` for `stats`, taken at wall-clock `now`.

    `RegionStat.received_at` is monotonic; it becomes wall-clock `seen_at` through the
    pair (`now`, `mono_now`) read at the same instant.
    """
    pairs = [(s.region_id, row_of(s)) for s in stats]
    return rows_table(
        [rid for rid, _ in pairs], [row for _, row in pairs], now, mono_now, accepted=accepted
    )


def rows_table(
    region_ids: Sequence[int],
    rows: Sequence[StatRow],
    now: float,
    mono_now: float,
    *,
    accepted: bool = True,
) -> pa.Table:
    """`stats_table` from the registry's stored rows, a column at a time.

    No object is built per region but the column values, so the garbage collector (which
    stops every thread, the event loop's included) has nothing new to walk.
    """
    n = len(rows)
    if n == 0:
        return STATS_SCHEMA.empty_table()
    offset_ms = (now - mono_now) * 1000

    def column(name: str) -> list[object]:
        return list(map(attrgetter(name), rows))

    cols: dict[str, object] = {
        "ts": [int(now * 1000)] * n,
        "seen_at": [int(r.received_at * 1000 + offset_ms) for r in rows],
        "region_id": region_ids,
        "accepted": [accepted] * n,
    }
    arrays = [
        pa.array(cols[f.name] if f.name in cols else column(f.name), type=f.type)
        for f in STATS_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=STATS_SCHEMA)


SLICE_ROWS = 4096
"""Rows a periodic snapshot reads between two yields to the event loop (~1-2 ms of work)."""


class _ChangedRows:
    """The rows received since the previous snapshot, gathered a slice at a time.

    `previous` maps region id -> the `received_at` written last time; a row whose
    `received_at` differs (or a region not in it) is new. Each `add` turns its changed
    rows into one Arrow table straight away, so what is kept between slices is Arrow
    buffers, not Python objects.
    """

    def __init__(self, previous: Mapping[int, float], now: float, mono_now: float) -> None:
        self._previous = previous
        self.seen: dict[int, float] = {}
        self.now = now
        self.mono_now = mono_now
        self.tables: list[pa.Table] = []
        self.written = 0

    def add(self, rows: Iterable[tuple[int, StatRow]]) -> None:
        previous = self._previous.get
        seen = self.seen
        ids: list[int] = []
        changed: list[StatRow] = []
        for rid, row in rows:
            received = seen[rid] = row.received_at
            if previous(rid) != received:
                ids.append(rid)
                changed.append(row)
        if changed:
            self.tables.append(rows_table(ids, changed, self.now, self.mono_now))
            self.written += len(changed)

    def add_rejected(self, stats: Sequence[RegionStat]) -> None:
        if stats:
            self.tables.append(stats_table(stats, self.now, self.mono_now, accepted=False))
            self.written += len(stats)


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


RowsByTopic = Mapping[str, Mapping[int, StatRow]]
"""The registry's live rows, topic -> region id -> row (`RegionRegistry.buckets`)."""


class StatHistoryWriter:
    """Writes the leader's region stats to the history directory every `interval` seconds.

    `directory` is the cluster's history root (a path or URL, see
    `metasrv.stat_location`); `writer` names this metasrv node in the file layout.
    `source` returns the registry's live rows by topic (`RegionRegistry.buckets`); give
    one that returns `{}` while this process is not the leader, since a follower's view
    is empty or outdated. `write_snapshot` writes a given snapshot at once (tests, tools).

    The periodic pass never holds the event loop, or the GIL from a thread, for long: it
    reads the live rows on the loop `SLICE_ROWS` at a time, yielding between slices, and
    only the Parquet encoding and the file writes (Arrow code that releases the GIL) run
    on a worker thread. At a million regions the rows take ~1 s of Python work a minute;
    done in one go, on the loop or in a thread, that second was a stall of every
    heartbeat (a thread holding the GIL makes the loop wait ~5 ms for it after every
    socket call).
    """

    def __init__(
        self,
        directory: str | Path,
        interval: float,
        source: Callable[[], RowsByTopic] | None = None,
        *,
        retention: float = DEFAULT_RETENTION,
        on_error: ErrorSink | None = None,
        writer: str = "metasrv",
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if retention < interval:
            raise ValueError("retention must be at least one interval")
        self.directory = str(directory).rstrip("/")
        self._fs, self._root = open_location(self.directory)
        self._writer = writer_partition(writer)
        self.interval = interval
        self.retention = retention
        self._source = source
        self._on_error = on_error or log_only("stat_history")
        self._written: dict[int, float] = {}
        self._rejected: dict[int, RegionStat] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

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
        stored = (
            snapshot.rows
            if isinstance(snapshot, StatSnapshot)
            else {rid: row_of(s) for rid, s in snapshot.items()}
        )
        changes.add(stored.items())
        changes.add_rejected(self._take_rejected())
        return self._write(changes)

    async def record(self) -> int:
        """One periodic pass over the source's live rows; returns the rows written."""
        assert self._source is not None
        changes = _ChangedRows(self._written, time.time(), time.monotonic())
        buckets = self._source()
        pending: list[tuple[int, StatRow]] = []
        # A topic's rows are read whole between two yields (the registry replaces rows,
        # never edits them), so no row is seen half-updated; a heartbeat arriving
        # between slices is written now or by the next pass.
        for topic in list(buckets):
            pending.extend(buckets.get(topic, _NO_ROWS).items())
            while len(pending) >= SLICE_ROWS:
                changes.add(pending[:SLICE_ROWS])
                del pending[:SLICE_ROWS]
                await asyncio.sleep(0)
        changes.add(pending)
        rejected = self._take_rejected()
        for start in range(0, len(rejected), SLICE_ROWS):
            changes.add_rejected(rejected[start : start + SLICE_ROWS])
            await asyncio.sleep(0)
        return await asyncio.to_thread(self._write, changes)

    def _take_rejected(self) -> list[RegionStat]:
        rejected = list(self._rejected.values())
        self._rejected.clear()
        return rejected

    def _write(self, changes: _ChangedRows) -> int:
        """Write the gathered rows and the snapshot's coverage row; prune old hours."""
        now = changes.now
        hour = f"{PARTITION}={hour_partition(now)}"
        name = f"snap-{int(now * 1000)}.parquet"
        if changes.tables:
            stats_dir = f"{self._root}/{STATS_DIR}/{hour}/{self._writer}"
            _write_whole(self._fs, pa.concat_tables(changes.tables), stats_dir, name)
        marker = pa.Table.from_pydict(
            {
                "ts": [int(now * 1000)],
                "regions": [len(changes.seen)],
                "written": [changes.written],
            },
            schema=SNAPSHOTS_SCHEMA,
        )
        marker_dir = f"{self._root}/{SNAPSHOTS_DIR}/{hour}/{self._writer}"
        _write_whole(self._fs, marker, marker_dir, name)
        # Regions gone from the registry are forgotten, so the map does not grow unbounded.
        self._written = changes.seen
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

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The running writer, if started."""
        return self._task

    async def start(self) -> None:
        """Start the periodic writer task (needs a `source`)."""
        if self._source is None:
            raise ValueError("StatHistoryWriter.start needs a snapshot source")
        if self._task is not None:
            return
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="stat-history-writer")

    async def stop(self) -> None:
        """Stop the writer; safe to call twice. A write in progress finishes first."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        await task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval)
                return
            try:
                written = await self.record()
            except Exception as exc:
                # A full or unwritable disk, or a value the history cannot hold, must not
                # take the leader down or stop the history; the reconcile job sees the
                # gap in `snapshots` and skips the staleness check. Logged and counted.
                self._on_error(exc)
                continue
            logger.debug("stat history written", extra={"rows": written})
