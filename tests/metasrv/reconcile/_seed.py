"""Small seeded worlds for the reconcile tests: a region map, stat history, Kafka facts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from metasrv.model import RegionStat
from metasrv.reconcile import MAP_SCHEMA
from metasrv.stat_history import StatHistoryWriter

NOW = 1_800_000_000.0
"""The instant the seeded worlds are judged at."""


def stat(
    region_id: int, topic: str, seen: float, *, prunable: int = 10, node_id: int = 1
) -> RegionStat:
    """A stat received at wall-clock `seen` (write it with `mono_now == now`)."""
    return RegionStat(
        region_id=region_id,
        node_id=node_id,
        topic=topic,
        flushed_entry_id=prunable,
        topic_latest_entry_id=None,
        memtable_bytes=0,
        manifest_version=None,
        received_at=seen,
    )


def write_map(path: Path, rows: Iterable[tuple[int, str, int, int | None]]) -> str:
    """(region_id, topic, node_id, checkpoint_entry_id) rows as the driver stages them."""
    listed = list(rows)
    table = pa.Table.from_pylist(
        [dict(zip(MAP_SCHEMA.names, r, strict=True)) for r in listed], schema=MAP_SCHEMA
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return str(path)


def write_history(
    directory: Path | str,
    snapshots: Iterable[tuple[float, Mapping[int, RegionStat], Iterable[RegionStat]]],
) -> None:
    """Write (time, accepted stats, rejected reports) snapshots in order, as the leader would."""
    writer = StatHistoryWriter(directory, 60.0, retention=30 * 86400.0)
    for ts, accepted, rejected in snapshots:
        writer.record_rejected(rejected)
        writer.write_snapshot(accepted, now=ts, mono_now=ts)
