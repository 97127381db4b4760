"""The reconcile job's kv snapshot: seconds to stage N topic-region keys as Parquet.

    python benchmarks/reconcile_snapshot.py    # 1M keys on SQLite, etcd and PostgreSQL
    python benchmarks/reconcile_snapshot.py -n 20000 --backends sqlite

`metasrv reconcile` first reads the whole topic-region map at one revision
(`metasrv.reconcile.read_snapshot`). For each backend this loads `-n` routes
(`__topic_region/{topic}/{region_id}`, 64 topics, the values the leader writes) under a
unique prefix (a throw-away schema on PostgreSQL), then times the snapshot `--runs` times
and prints the best and the median with keys/s. Reference: 14.6 s for 1M keys on SQLite
before the snapshot read pages column-wise (see BENCHMARKS.md). Loading 1M keys takes
minutes on etcd; the SQLite file is kept under `--data` and reused.

Endpoints default to METASRV_TEST_ETCD / METASRV_TEST_POSTGRES, else the local stack's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _pgschema import fresh_pg_schema  # benchmarks/ is on sys.path when run as a script

import migrations
from metasrv import keys
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from metasrv.reconcile import read_snapshot
from toolbox.stack import StackConfig, endpoints_of

TOPICS = 64


def routes(n: int) -> Iterator[list[tuple[str, bytes]]]:
    """`n` routes in batches of 10,000: region ids as GreptimeDB builds them."""
    batch: list[tuple[str, bytes]] = []
    for i in range(n):
        region_id = (1024 + i // 1000) << 32 | (i % 1000)
        checkpoint = i if i % 3 else None
        batch.append(
            (
                keys.topic_region(f"greptimedb_wal_topic_{i % TOPICS}", region_id),
                keys.encode_route(i % 7, checkpoint),
            )
        )
        if len(batch) == 10_000:
            yield batch
            batch = []
    if batch:
        yield batch


def _load(kv: KvBackend, n: int) -> float:
    t0 = time.perf_counter()
    for batch in routes(n):
        kv.batch_put(batch)
    return time.perf_counter() - t0


@contextmanager
def backend(name: str, n: int, data: Path) -> Iterator[tuple[KvBackend, float | None]]:
    """The backend with `n` routes loaded; yields it and the load time (None: reused)."""
    stack = endpoints_of(StackConfig.from_env())
    if name == "sqlite":
        db = data / f"kv-{n}.db"
        fresh = not db.exists()
        url = f"sqlite:///{db}"
        if fresh:
            migrations.upgrade(url)
        kv = SqlKv(url)
        try:
            yield kv, _load(kv, n) if fresh else None
        finally:
            kv.close()
    elif name == "postgresql":
        with fresh_pg_schema(os.environ.get("METASRV_TEST_POSTGRES", stack.postgres_url)) as url:
            kv = SqlKv(url)
            try:
                yield kv, _load(kv, n)
            finally:
                kv.close()
    elif name == "etcd":
        endpoint = os.environ.get("METASRV_TEST_ETCD", stack.etcd_endpoint)
        kv = EtcdKv([endpoint], f"bench-snap-{uuid.uuid4().hex[:8]}/")
        try:
            yield kv, _load(kv, n)
        finally:
            kv.delete_prefix("")
            kv.close()
    else:
        raise SystemExit(f"unknown backend {name!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="topic-region keys")
    parser.add_argument("--backends", default="sqlite,etcd,postgresql")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("/tmp/reconcile-snapshot-bench"))
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    results = []
    for name in [b for b in args.backends.split(",") if b]:
        with backend(name, args.n, args.data) as (kv, load_s):
            times = []
            for run in range(args.runs):
                t0 = time.perf_counter()
                snap = read_snapshot(kv, args.data / f"map-{name}-{run}.parquet")
                times.append(time.perf_counter() - t0)
                if snap.regions != args.n:
                    raise SystemExit(f"{name}: snapshot saw {snap.regions} of {args.n} keys")
        row = {
            "backend": name,
            "keys": args.n,
            "load_s": None if load_s is None else round(load_s, 1),
            "best_s": round(min(times), 2),
            "median_s": round(statistics.median(times), 2),
            "keys_per_s": int(args.n / min(times)),
        }
        results.append(row)
        print(
            f"{name:<10} {args.n:>9} keys: best {row['best_s']:6.2f}s "
            f"median {row['median_s']:6.2f}s  {row['keys_per_s']:>9} keys/s",
            flush=True,
        )
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    print(f"load average at the end: {' '.join(load)}")
    if args.json:
        args.json.write_text(json.dumps({"load_average": load, "results": results}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
