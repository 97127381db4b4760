"""Synthetic inputs for the reconcile benchmark: a region map, stat history, Kafka facts.

    python benchmarks/_reconcile_datagen.py --stat-rows 10000000 --out /tmp/reconcile-bench/10m

Writes, under `--out` (keep it out of the repo, e.g. /tmp):

- `map.parquet`: the topic-region map (`metasrv.reconcile.MAP_SCHEMA`), regions = rows / 10
- `history/`: one cluster's stat history in the layout of `metasrv.stat_history` (10
  snapshots; the first 5 written by leader `bench-a`, the rest by `bench-b`, as after a
  failover)
- `world.json`: now, pool, prefix, Kafka topics and offsets, topic markers

Every finding kind is seeded: a region in 1000 stops reporting after the first snapshot
(stale), one in 1000 reports the next pool topic (mismatch), N/1000 extra regions report
without being mapped, the last pool topic is missing from Kafka, two prefix topics sit
outside the pool, topic 2's log start is past half its regions' prunable ids, and one
region in 50 is mapped to topic 0 (skew). Columns are built with pyarrow compute, so 10M
rows take seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metasrv.reconcile import MAP_SCHEMA
from metasrv.stat_history import (
    PARTITION,
    SNAPSHOTS_DIR,
    SNAPSHOTS_SCHEMA,
    STATS_DIR,
    STATS_SCHEMA,
    hour_partition,
    writer_partition,
)

PREFIX = "bench_wal"
ROUNDS = 10
INTERVAL_S = 600
STALE_AFTER_S = 1800


@dataclass(frozen=True)
class World:
    """The generated data set and the parameters to judge it with."""

    root: Path
    now: float
    regions: int
    stat_rows: int
    pool: list[str]

    @property
    def map_path(self) -> str:
        return str(self.root / "map.parquet")

    @property
    def history_dir(self) -> str:
        return str(self.root / "history")

    def facts(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / "world.json").read_text())
        return data


def _ids(n: int, offset: int = 0) -> pa.Array:
    return pa.array(range(offset, offset + n), pa.int64())


def _region_id(idx: pa.Array, table_base: int) -> pa.Array:
    table = pc.add(pc.divide(idx, 1000), table_base)
    return pc.bit_wise_or(pc.shift_left(table, 32), pc.remainder(idx, 1000))


def _take(names: list[str], index: pa.Array) -> pa.Array:
    return pc.take(pa.array(names, pa.string()), index)


def generate(out: Path, stat_rows: int, pool_size: int = 256, now: float | None = None) -> World:
    """Write one data set of about `stat_rows` stat rows (regions = stat_rows / 10)."""
    now = float(int(now if now is not None else time.time()))
    regions = max(stat_rows // ROUNDS, 1000)
    pool = [f"{PREFIX}_{n}" for n in range(pool_size)]
    out.mkdir(parents=True, exist_ok=True)

    idx = _ids(regions)

    def mod(k: int) -> pa.Array:
        return pc.remainder(idx, k)

    topic_idx = pc.if_else(pc.equal(mod(50), 1), 0, mod(pool_size))
    no_checkpoint = pa.nulls(regions, pa.int64())
    checkpoint = pc.if_else(pc.equal(mod(3), 0), no_checkpoint, pc.add(mod(977), 1000))
    region_ids = _region_id(idx, 1024)
    mapped = pa.table(
        {
            "region_id": region_ids,
            "topic": _take(pool, topic_idx),
            "node_id": mod(100),
            "checkpoint_entry_id": checkpoint,
        },
        schema=MAP_SCHEMA,
    )
    pq.write_table(mapped, out / "map.parquet")

    stale = pc.equal(mod(1000), 7)
    mismatch = pc.equal(mod(1000), 13)
    reported_idx = pc.if_else(mismatch, pc.remainder(pc.add(topic_idx, 1), pool_size), topic_idx)
    unmapped_n = max(regions // 1000, 1)
    u_idx = _ids(unmapped_n)
    written = 0
    for k in range(ROUNDS):
        ts = now - (ROUNDS - k) * INTERVAL_S + 60
        keep = pc.invert(stale) if k else pa.array([True] * regions)
        base = pa.table(
            {
                "region_id": region_ids,
                "node_id": mod(100),
                "topic_idx": reported_idx,
                "i": idx,
            }
        ).filter(keep)
        u = pa.table(
            {
                "region_id": _region_id(u_idx, 900_000),
                "node_id": pc.remainder(u_idx, 100),
                "topic_idx": pc.remainder(u_idx, pool_size),
                "i": u_idx,
            }
        )
        rows = pa.concat_tables([base, u])
        n = rows.num_rows
        i = rows["i"]
        seen = pc.subtract(pa.scalar(int(ts * 1000)), pc.multiply(pc.remainder(i, 30), 1000))
        prunable = pc.add(pc.remainder(i, 97), 1000 + k * 100)
        table = pa.table(
            {
                "ts": pa.array([int(ts * 1000)] * n, pa.int64()).cast(pa.timestamp("ms", "UTC")),
                "seen_at": seen.cast(pa.timestamp("ms", "UTC")),
                "region_id": rows["region_id"],
                "node_id": rows["node_id"],
                "topic": _take(pool, rows["topic_idx"]),
                "flushed_entry_id": prunable,
                "topic_latest_entry_id": pa.nulls(n, pa.int64()),
                "prunable_entry_id": prunable,
                "memtable_bytes": pa.array([4096] * n, pa.int64()),
                "manifest_version": pa.nulls(n, pa.int64()),
                "accepted": pa.array([True] * n, pa.bool_()),
            },
            schema=STATS_SCHEMA,
        )
        hour = f"{PARTITION}={hour_partition(ts)}"
        writer = writer_partition("bench-a" if k < ROUNDS // 2 else "bench-b")
        name = f"snap-{int(ts * 1000)}.parquet"
        for sub, tbl in (
            (STATS_DIR, table),
            (
                SNAPSHOTS_DIR,
                pa.table(
                    {"ts": [int(ts * 1000)], "regions": [n], "written": [n]},
                    schema=pa.schema([pa.field(f.name, pa.int64()) for f in SNAPSHOTS_SCHEMA]),
                ).cast(SNAPSHOTS_SCHEMA),
            ),
        ):
            path = out / "history" / sub / hour / writer / name
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(tbl, path, compression="zstd")
        written += n

    kafka_topics = [*pool[:-1], f"{PREFIX}_{pool_size}", f"{PREFIX}_{pool_size + 1}", "other"]
    offsets = {t: [0, 5000] for t in kafka_topics}
    offsets[pool[2]] = [1000 + (ROUNDS - 1) * 100 + 50, 5000]
    world = {
        "now": now,
        "prefix": PREFIX,
        "pool": pool,
        "kafka_topics": kafka_topics,
        "offsets": offsets,
        "markers": {t: 500 for t in pool},
        "stale_after_s": STALE_AFTER_S,
        "history_window_s": ROUNDS * INTERVAL_S + 3600,
        "regions": regions,
        "stat_rows": written,
    }
    (out / "world.json").write_text(json.dumps(world))
    return World(out, now, regions, written, pool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stat-rows", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    t0 = time.perf_counter()
    world = generate(args.out, args.stat_rows)
    print(
        f"{world.regions} regions, {world.stat_rows} stat rows in {args.out} "
        f"({time.perf_counter() - t0:.1f}s)"
    )


if __name__ == "__main__":
    main()
