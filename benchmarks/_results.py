"""Where a benchmark's result files go, which code it measured, and how its runs become
figures.

A result file is `benchmarks/results/<name>` (the name carries the script and a time
stamp), or lands in the directory `METASRV_BENCH_RESULTS` names: `compare.py` gives each
run its own, keeps what it reads from them in its one comparison file and leaves
`benchmarks/results/` to that file. `product_tree()` is the source tree whose `metasrv` this
process imports (`PYTHONPATH` first, then the editable install): the tree a benchmark's
daemons must run from, so that a comparison against an older commit measures that commit.

A scenario benchmark (`replicated_wal.py`, `wal_archive.py`) runs each scenario `--runs` times
(`run_scenarios`), names its figures in a table `{scenario: [(path in a run's row, label)]}`
(`Figures`), summarises each as its median over the runs (`summarize`) and prints them as one
markdown table (`print_table`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""This tree's results directory."""
RESULTS_ENV = "METASRV_BENCH_RESULTS"
"""Names a directory that takes the result files instead (`compare.py` sets it)."""

Figures = dict[str, list[tuple[str, str]]]
"""Each scenario's figures: (dotted path in a run's row, label), in the table's order."""


def results_dir() -> Path:
    """The directory result files go to (created)."""
    where = Path(os.environ.get(RESULTS_ENV) or RESULTS)
    where.mkdir(parents=True, exist_ok=True)
    return where


def stamp(utc: bool = False) -> str:
    """The time in a result file's name: `20261127-185400`, or `20261127T185400Z` in UTC."""
    if utc:
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return time.strftime("%Y%m%d-%H%M%S")


def write_result(data: Any, name: str, out: str | Path | None = None) -> Path:
    """`data` as indented JSON to `out`, or to `name` in `results_dir()`; its path."""
    path = Path(out) if out else results_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def save_run(result: dict[str, Any], stem: str, write: bool = True) -> None:
    """Stamp a scenario benchmark's result with its end (load average, UTC time) and, if
    `write`, write it to `{stem}-{UTC stamp}.json` and say where."""
    result["host"]["loadavg_end"] = os.getloadavg()
    result["finished_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    if write:
        print(f"\nJSON: {write_result(result, f'{stem}-{stamp(utc=True)}.json')}")


def product_tree() -> Path:
    """The source tree the imported `metasrv` package lives in."""
    import metasrv

    return Path(metasrv.__file__).resolve().parent.parent


def commit_of(tree: Path) -> str:
    """The short commit checked out in `tree` ("" outside a git checkout)."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True
    )
    return done.stdout.strip()


def host() -> dict[str, Any]:
    """The machine a run measured: cores, platform, Python, the load average at the start."""
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def log(message: str) -> None:
    """A progress line on stderr (stdout carries the table and the figures)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def dig(row: dict[str, Any], path: str) -> Any:
    """The value at a dotted `path` in a run's row (None where a part is missing)."""
    value: Any = row
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def summarize(figures: list[tuple[str, str]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's value in every run and its median over the runs that have a number."""
    out: dict[str, Any] = {}
    for key, _ in figures:
        values = [dig(r, key) for r in runs]
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        out[key] = {"median": median(numbers), "runs": values}
    return out


def run_scenarios(
    names: list[str],
    runs: int,
    runners: dict[str, Callable[[int], dict[str, Any]]],
    figures: Figures,
    after_run: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Each named scenario run `runs` times: {name: {"runs": rows, "summary": ...}}. A run
    that raises leaves a row with its `error`; `after_run` (a clean-up) follows each run."""
    scenarios: dict[str, Any] = {}
    for name in names:
        rows: list[dict[str, Any]] = []
        scenarios[name] = {"runs": rows}
        for run in range(runs):
            log(f"{name}: run {run + 1}/{runs}")
            started = time.monotonic()
            try:
                row = runners[name](run)
            except Exception as exc:
                log(f"{name} run {run + 1} failed: {exc!r}")
                row = {"error": repr(exc)[:2000]}
            finally:
                if after_run is not None:
                    after_run()
            row["wall_s"] = round(time.monotonic() - started, 1)
            rows.append(row)
        scenarios[name]["summary"] = summarize(figures[name], rows)
    return scenarios


def fmt(value: Any) -> str:
    """A table cell: 3 decimals under 100, none above, `-` for no value."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def print_table(scenarios: dict[str, Any], figures: Figures) -> None:
    """The markdown table of `run_scenarios`' result: each figure's median and every run's
    value, then a scenario's failed runs (how many, the first error)."""
    print("| scenario | figure | median | runs |")
    print("|---|---|---|---|")
    for name, data in scenarios.items():
        for key, label in figures[name]:
            row = data["summary"][key]
            runs = ", ".join(fmt(v) for v in row["runs"])
            print(f"| {name} | {label} | {fmt(row['median'])} | {runs} |")
        errors = [r["error"] for r in data["runs"] if "error" in r]
        if errors:
            print(f"| {name} | failed runs | {len(errors)} | {errors[0][:100]} |")
