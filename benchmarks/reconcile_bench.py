"""Reconcile benchmark: the Spark job on local[2] vs a single-process pyarrow baseline.

    .venv/bin/python benchmarks/reconcile_bench.py            # 100k, 1M, 10M stat rows
    .venv/bin/python benchmarks/reconcile_bench.py --sizes 100000 --kv-regions 0

For each size (stat rows; regions = rows / 10, so 10M rows = 1M regions) it generates
synthetic Parquet under `--data` (default /tmp/reconcile-bench, never the repo; reused
when present), runs the Spark job and, where asked, the pyarrow baseline on the same
inputs, and checks both report exactly the same findings (kind, severity, topic, region,
evidence). `--kv-regions N` also times the driver's kv snapshot of N regions from a
SQLite kv file (the staging step of a real run; etcd and PostgreSQL are shared services
here, so the benchmark does not load them).

Each size runs in a fresh process, as an operator's `metasrv reconcile` would: "end to
end" = Spark session start + kv snapshot staging (when measured at that size) + the
Spark job cold (read map and history, every rule, write the findings Parquet, count) +
reading the findings back on the driver. The job then runs again in the same session
("warm") to show how the work itself grows with size, without JVM start-up and JIT.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._reconcile_baseline import baseline_findings
from benchmarks._reconcile_datagen import World, generate
from metasrv.model import PartitionOffsets
from metasrv.reconcile import (
    Finding,
    JobInputs,
    ReconcileParams,
    build_session,
    read_snapshot,
    run_job,
)


def _inputs(world: World, map_path: str | None = None) -> tuple[JobInputs, ReconcileParams]:
    facts = world.facts()
    offsets = {t: PartitionOffsets(a, b) for t, (a, b) in facts["offsets"].items()}
    inputs = JobInputs(
        map_path=map_path or world.map_path,
        history_dir=world.history_dir,
        markers=facts["markers"],
        kafka_topics=frozenset(facts["kafka_topics"]),
        offsets=offsets,
        pool=tuple(facts["pool"]),
        prefix=str(facts["prefix"]),
    )
    params = ReconcileParams(
        now=float(facts["now"]),
        stale_after=float(facts["stale_after_s"]),
        history_window=float(facts["history_window_s"]),
    )
    return inputs, params


def _signature(findings: list[Finding]) -> set[tuple[Any, ...]]:
    return {(f.key, f.severity.value, json.dumps(f.evidence, sort_keys=True)) for f in findings}


def _world(root: Path, rows: int) -> World:
    path = root / f"rows-{rows}"
    if (path / "world.json").exists():
        facts = json.loads((path / "world.json").read_text())
        return World(path, facts["now"], facts["regions"], facts["stat_rows"], facts["pool"])
    shutil.rmtree(path, ignore_errors=True)
    return generate(path, rows)


def _kv_snapshot(world: World, regions: int, work: Path) -> tuple[str, float, float]:
    """Load `regions` routes into a SQLite kv (once), then time the snapshot staging.

    The kv file is seeded batch by batch under a temporary name and renamed when complete,
    so 10M routes never sit in memory as Python objects and a killed run leaves no partial
    file behind to be mistaken for a seeded one.
    """
    from metasrv.kv import SqlKv

    db = work / f"kv-{regions}.db"
    t0 = time.perf_counter()
    if not db.exists():
        from metasrv import keys

        partial = db.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        seeding = SqlKv.open(f"sqlite:///{partial}", create=True)
        left = regions
        for batch in pq.ParquetFile(world.map_path).iter_batches(batch_size=100_000):
            rows = batch.slice(0, left).to_pylist()
            seeding.batch_put(
                [
                    (
                        keys.topic_region(r["topic"], r["region_id"]),
                        keys.encode_route(r["node_id"], r["checkpoint_entry_id"]),
                    )
                    for r in rows
                ]
            )
            left -= len(rows)
            if left == 0:
                break
        seeding.close()
        partial.rename(db)
    load = time.perf_counter() - t0
    kv = SqlKv.open(f"sqlite:///{db}", create=True)
    t0 = time.perf_counter()
    snap = read_snapshot(kv, work / f"map-{regions}.parquet")
    took = time.perf_counter() - t0
    kv.close()
    assert snap.regions == regions, (snap.regions, regions)
    return snap.map_path, took, load


def measure(args: argparse.Namespace, rows: int) -> dict[str, Any]:
    """One size in this (fresh) process: cold end to end, then the job again warm."""
    t0 = time.perf_counter()
    world = _world(args.data, rows)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    conf = {"spark.executor.memory": args.executor_memory} if args.executor_memory else None
    spark = build_session(args.master, driver_memory=args.driver_memory, conf=conf)
    session_s = time.perf_counter() - t0
    map_path: str | None = None
    kv_s = load_s = None
    if args.kv_regions and world.regions == args.kv_regions:
        map_path, kv_s, load_s = _kv_snapshot(world, world.regions, args.data)
    inputs, params = _inputs(world, map_path)
    out = args.data / f"findings-{rows}-{_tag(args.master)}"
    t0 = time.perf_counter()
    result = run_job(spark, inputs, params, str(out))
    job_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    spark_found = [Finding.from_row(r) for r in pq.read_table(out).to_pylist()]
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = run_job(spark, inputs, params, str(out))
    warm_s = time.perf_counter() - t0
    spark.stop()
    row: dict[str, Any] = {
        "master": args.master,
        "findings_path": str(out),
        "stat_rows": world.stat_rows,
        "regions": world.regions,
        "generate_s": round(gen_s, 1),
        "session_s": round(session_s, 1),
        "kv_snapshot_s": None if kv_s is None else round(kv_s, 1),
        "kv_load_s": None if load_s is None else round(load_s, 1),
        "spark_job_cold_s": round(job_s, 1),
        "spark_job_warm_s": round(warm_s, 1),
        "read_back_s": round(read_s, 2),
        "end_to_end_s": round(session_s + (kv_s or 0.0) + job_s + read_s, 1),
        "findings": len(spark_found),
        "counts": result.counts,
        "phases_cold_s": result.timings,
        "phases_warm_s": warm.timings,
    }
    if rows in args.baseline_set:
        t0 = time.perf_counter()
        base, _ = baseline_findings(inputs, params)
        row["baseline_s"] = round(time.perf_counter() - t0, 1)
        row["engines_agree"] = _signature(base) == _signature(spark_found)
    return row


def _tag(master: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in master)


def measure_baseline(args: argparse.Namespace, rows: int) -> dict[str, Any]:
    """The pyarrow baseline alone (this process may be memory-capped), checked against
    the findings a Spark run wrote to `args.compare`."""
    world = _world(args.data, rows)
    inputs, params = _inputs(world)
    t0 = time.perf_counter()
    base, _ = baseline_findings(inputs, params)
    took = time.perf_counter() - t0
    row: dict[str, Any] = {"stat_rows": world.stat_rows, "baseline_s": round(took, 1)}
    if args.compare:
        spark_found = [Finding.from_row(r) for r in pq.read_table(args.compare).to_pylist()]
        row["engines_agree"] = _signature(base) == _signature(spark_found)
    row["findings"] = len(base)
    return row


def _line(row: dict[str, Any]) -> str:
    base = (
        f"  pyarrow {row['baseline_s']:5.1f}s agree={row['engines_agree']}"
        if "baseline_s" in row
        else ""
    )
    kv = f"  kv snapshot {row['kv_snapshot_s']}s" if row["kv_snapshot_s"] is not None else ""
    return (
        f"{row['stat_rows']:>10} rows {row['regions']:>8} regions: session {row['session_s']:5.1f}s"
        f"{kv}  job cold {row['spark_job_cold_s']:5.1f}s warm {row['spark_job_warm_s']:5.1f}s"
        f"  end-to-end {row['end_to_end_s']:5.1f}s{base}  findings {row['findings']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--baseline-sizes", default="100000,1000000")
    parser.add_argument("--kv-regions", type=int, default=1_000_000)
    parser.add_argument("--data", type=Path, default=Path("/tmp/reconcile-bench"))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--executor-memory", default="", help="Spark executors (cluster masters)")
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--one-baseline", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--compare", help=argparse.SUPPRESS)
    parser.add_argument("--memory-cap", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.baseline_set = {int(s) for s in args.baseline_sizes.split(",") if s}
    args.data.mkdir(parents=True, exist_ok=True)
    if args.one is not None:
        print("RESULT " + json.dumps(measure(args, args.one)))
        return
    if args.one_baseline is not None:
        if args.memory_cap:
            import resource

            # A cap instead of the kernel's OOM killer: the baseline fails with MemoryError.
            resource.setrlimit(resource.RLIMIT_AS, (args.memory_cap, args.memory_cap))
        print("RESULT " + json.dumps(measure_baseline(args, args.one_baseline)))
        return
    results: list[dict[str, Any]] = []
    for rows in [int(s) for s in args.sizes.split(",") if s]:
        # A fresh interpreter and JVM per size: the cold numbers are what an operator sees.
        argv = [sys.executable, __file__, "--one", str(rows)]
        for flag in (
            "baseline_sizes",
            "kv_regions",
            "data",
            "master",
            "driver_memory",
            "executor_memory",
        ):
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(done.stdout + done.stderr, file=sys.stderr)
            sys.exit(1)
        row = json.loads(lines[-1].removeprefix("RESULT "))
        results.append(row)
        print(_line(row), flush=True)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    print(f"load average at the end: {' '.join(load)} (2 cores)")
    if args.json:
        args.json.write_text(json.dumps({"load_average": load, "sizes": results}, indent=2))
    if any(r.get("engines_agree") is False for r in results):
        print("MISMATCH between Spark and the baseline", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
