"""Reconcile at scale: local[2] vs a 2-worker standalone cluster vs the pyarrow baseline.

    .venv/bin/python benchmarks/reconcile_scale.py                 # 10M and 100M stat rows
    .venv/bin/python benchmarks/reconcile_scale.py --sizes 100000  # a quick check

For each size (stat rows; regions = rows / 10) it runs, each in a fresh process
(`reconcile_bench.py --one`, so every cold number is what an operator sees):

1. the Spark job on `local[2]`, including the kv snapshot of every region from a SQLite
   kv file (loaded once under `--data`, reused);
2. the same on a standalone cluster this script starts from PySpark's jars (one master,
   two workers of 1 core and `--worker-memory` each, state under `--data/spark-cluster`,
   ports from `--spark-port`), stopped at the end;
3. the single-process pyarrow baseline, capped at `--baseline-memory` bytes of address
   space and `--baseline-timeout` seconds, so running out of either is reported, not fatal.

It checks that the three agree finding for finding and prints one markdown table for
BENCHMARKS.md (also `--json`). Data lives under `--data` (default /tmp, never the repo):
about 6 GB for 100M rows. Expect roughly an hour on an idle 2-core machine, most of it at
100M rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.parquet as pq

from toolbox.stack import StackConfig, down, spark_up

BENCH = Path(__file__).with_name("reconcile_bench.py")


def _child(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run one `reconcile_bench.py` child; its RESULT line, or what stopped it."""
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode == 0 and lines:
        result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
        return result
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    oom = any(s in ln for ln in tail for s in ("MemoryError", "OutOfMemory", "bad_alloc"))
    return {"error": "out of memory" if oom else f"exit {done.returncode}: {' | '.join(tail)}"}


def _same_findings(paths: list[Any]) -> bool:
    """Both Spark runs judged the same world at the same instant: same rows, any order."""
    tables = [pq.read_table(p) for p in paths]
    keys = [(name, "ascending") for name in tables[0].column_names]
    return bool(tables[0].sort_by(keys).equals(tables[1].sort_by(keys)))


def _row(rows: int, engine: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"| {rows:,} | {engine} | {r['error']} | | | | | |"
    if engine == "pyarrow baseline":
        agree = r.get("engines_agree")
        return (
            f"| {rows:,} | {engine} | | | {r['baseline_s']} | | {r['baseline_s']} "
            f"| {r['findings']} (agree: {agree}) |"
        )
    return (
        f"| {rows:,} | {engine} | {r['session_s']} | {r['kv_snapshot_s']} "
        f"| {r['spark_job_cold_s']} | {r['spark_job_warm_s']} | {r['end_to_end_s']} "
        f"| {r['findings']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000000,100000000")
    parser.add_argument("--data", type=Path, default=Path("/tmp/reconcile-bench"))
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--worker-memory", default="5g", help="per standalone worker")
    parser.add_argument("--spark-port", type=int, default=17177)
    parser.add_argument("--spark-timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--baseline-timeout", type=float, default=1800.0)
    parser.add_argument("--baseline-memory", type=int, default=16 << 30, help="bytes")
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    cluster = StackConfig.from_env(
        state_dir=args.data / "spark-cluster",
        spark_port=args.spark_port,
        spark_worker_memory=args.worker_memory,
    )
    t0 = time.perf_counter()
    master = spark_up(cluster)
    print(f"standalone cluster {master} up in {time.perf_counter() - t0:.0f}s", flush=True)
    table = [
        "| stat rows | engine | session s | kv snapshot s | job cold s | job warm s "
        "| end to end s | findings |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    results: list[dict[str, Any]] = []
    try:
        for rows in [int(s) for s in args.sizes.split(",") if s]:
            common = [
                "--data",
                str(args.data),
                "--baseline-sizes",
                "",
                "--kv-regions",
                str(max(rows // 10, 1000)),
                "--driver-memory",
                args.driver_memory,
            ]
            runs: dict[str, dict[str, Any]] = {}
            for engine, m, extra in (
                ("local[2]", "local[2]", []),
                ("standalone 2x1 core", master, ["--executor-memory", args.worker_memory]),
            ):
                argv = ["--one", str(rows), "--master", m, *common, *extra]
                runs[engine] = _child(argv, args.spark_timeout)
                print(_row(rows, engine, runs[engine]), flush=True)
            local = runs["local[2]"]
            compare = ["--compare", local["findings_path"]] if "findings_path" in local else []
            runs["pyarrow baseline"] = _child(
                [
                    "--one-baseline",
                    str(rows),
                    "--data",
                    str(args.data),
                    "--memory-cap",
                    str(args.baseline_memory),
                    *compare,
                ],
                args.baseline_timeout,
            )
            print(_row(rows, "pyarrow baseline", runs["pyarrow baseline"]), flush=True)
            table += [_row(rows, e, r) for e, r in runs.items()]
            paths = [r.get("findings_path") for e, r in runs.items() if e != "pyarrow baseline"]
            same = _same_findings(paths) if all(paths) else None
            print(f"local[2] and standalone findings identical: {same}", flush=True)
            results.append({"stat_rows": rows, "runs": runs, "spark_engines_agree": same})
    finally:
        down(cluster)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print("\n".join(["", *table, "", f"load average at the end: {' '.join(load)} (2 cores)"]))
    if args.json:
        args.json.write_text(json.dumps({"load_average": load, "sizes": results}, indent=2))
    disagree = [
        r["stat_rows"]
        for r in results
        if r["runs"]["pyarrow baseline"].get("engines_agree") is False
        or r["spark_engines_agree"] is False
    ]
    if disagree:
        print(f"MISMATCH between engines at {disagree}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
