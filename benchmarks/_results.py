"""Where a benchmark's result files go, and which code it measured.

A result file is `benchmarks/results/<name>` (the name carries the script and a time
stamp), or lands in the directory `METASRV_BENCH_RESULTS` names: `compare.py` gives each
run its own, keeps what it reads from them in its one comparison file and leaves
`benchmarks/results/` to that file. `product_tree()` is the source tree whose `metasrv` this
process imports (`PYTHONPATH` first, then the editable install): the tree a benchmark's
daemons must run from, so that a comparison against an older commit measures that commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""This tree's results directory."""
RESULTS_ENV = "METASRV_BENCH_RESULTS"
"""Names a directory that takes the result files instead (`compare.py` sets it)."""


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
