"""Region checkpoint writes: kv `batch_put` vs one put per key, on real etcd and PostgreSQL.

The leader persists region checkpoints (`__topic_region/{topic}/{region_id}` JSON) in
batches; this measures how many keys per second that reaches, against the naive
one-write-per-key baseline. Prints the median of each series over `--runs` runs and
the batch/baseline ratio. Target: >= 20,000 keys/s to etcd with batch_put.

    python benchmarks/kv_checkpoint.py [-n 20000] [--runs 3] [--etcd HOST:PORT] [--postgres URL]

Endpoints default to METASRV_TEST_ETCD / METASRV_TEST_POSTGRES, else the local stack's.
Keys live under a unique prefix (a fresh schema on PostgreSQL) removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence

from _pgschema import fresh_pg_schema  # benchmarks/ is on sys.path when run as a script

from metasrv import keys
from metasrv.kv import EtcdKv, KvBackend, SqlKv

DEFAULT_ETCD = "127.0.0.1:12379"
DEFAULT_POSTGRES = "postgresql+psycopg://metasrv:metasrv@127.0.0.1:15432/metasrv"
TARGET_ETCD_KEYS_PER_S = 20_000


def checkpoint_items(n: int, topics: int, round_no: int) -> list[tuple[str, bytes]]:
    """`n` region checkpoints spread over `topics` topics (values change every round)."""
    items = []
    for i in range(n):
        topic = f"greptimedb_wal_topic_{i % topics}"
        region_id = (1024 + i // topics) << 32 | (i % topics)
        value = {"node_id": i % 7, "checkpoint": {"entry_id": 1_000_000 + round_no * n + i}}
        items.append((keys.topic_region(topic, region_id), json.dumps(value).encode()))
    return items


def measure(
    write: Callable[[Sequence[tuple[str, bytes]]], None],
    kv: KvBackend,
    n: int,
    topics: int,
    runs: int,
) -> list[float]:
    """keys/s of `write` over `runs` fresh rounds (each round rewrites every key)."""
    rates = []
    for r in range(runs):
        items = checkpoint_items(n, topics, r)
        start = time.perf_counter()
        write(items)
        rates.append(n / (time.perf_counter() - start))
        stored = sum(1 for _ in kv.scan(keys.TOPIC_REGION_PREFIX, page_size=5000))
        if stored != n:
            raise SystemExit(f"expected {n} keys after the round, found {stored}")
    return rates


def one_by_one(kv: KvBackend) -> Callable[[Sequence[tuple[str, bytes]]], None]:
    def write(items: Sequence[tuple[str, bytes]]) -> None:
        for key, value in items:
            kv.put(key, value)

    return write


def report(name: str, rates: list[float]) -> float:
    median = statistics.median(rates)
    runs = ", ".join(f"{r:,.0f}" for r in rates)
    print(f"{name:<34} median {median:>10,.0f} keys/s   (runs: {runs})")
    return median


def compare(name: str, kv: KvBackend, args: argparse.Namespace) -> float:
    """Print batch_put and per-key medians and their ratio; return the batch_put median."""
    try:
        batch = report(
            f"{name} batch_put ({kv.max_txn_ops}/txn)",
            measure(kv.batch_put, kv, args.n, args.topics, args.runs),
        )
        kv.delete_prefix("")
        single = report(
            f"{name} put per key (baseline)",
            measure(one_by_one(kv), kv, args.baseline_n, args.topics, args.runs),
        )
    finally:
        kv.delete_prefix("")
    print(f"{name + ' batch_put / baseline':<34} {batch / single:>10.1f}x")
    return batch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20_000, help="region checkpoints per round")
    parser.add_argument(
        "--baseline-n",
        type=int,
        default=3_000,
        help="keys per round for the one-put-per-key baseline (it is slow)",
    )
    parser.add_argument("--topics", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--etcd", default=os.environ.get("METASRV_TEST_ETCD", DEFAULT_ETCD))
    parser.add_argument(
        "--postgres", default=os.environ.get("METASRV_TEST_POSTGRES", DEFAULT_POSTGRES)
    )
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)

    print(
        f"kv checkpoint benchmark: {args.n:,} keys per round ({args.topics} topics), "
        f"baseline {args.baseline_n:,} keys, median of {args.runs} runs"
    )
    etcd = EtcdKv(args.etcd, f"bench-{uuid.uuid4().hex[:8]}/")
    try:
        batch = compare("etcd", etcd, args)
    finally:
        etcd.close()
    if not args.no_postgres:
        with fresh_pg_schema(args.postgres) as url:
            pg = SqlKv(url)
            try:
                compare("PostgreSQL", pg, args)
            finally:
                pg.close()

    ok = batch >= TARGET_ETCD_KEYS_PER_S
    print(f"etcd batch_put target {TARGET_ETCD_KEYS_PER_S:,} keys/s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
