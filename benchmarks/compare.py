"""Run one figure at an older commit and at the working tree, side by side.

    .venv/bin/python benchmarks/compare.py [--base 8cab7e3] [--runs N] [--metric WORD]
        [--script-from base|work] [--keep] [--out FILE] -- FIGURE [ARGS ...]

FIGURE is a benchmark script with its own arguments (`benchmarks/purge_cycle.py --topics
1024 --runs 3`), or `pytest` with its arguments (`pytest tests/faults`). compare.py checks
the commit out in a temporary `git worktree`, then runs the figure `--runs` times on each
side, alternating (base, work, base, work, ...), with this virtualenv's interpreter:

- **base**: `PYTHONPATH` = the worktree and the worktree as the working directory, so the
  figure imports the commit's `metasrv`, `api`, `procedures`, `toolbox`, `cli` and
  `migrations`, and the `metasrv` console script its daemons start runs the commit's code
  too. The script is the commit's own copy (`--script-from base`, the default) when the
  commit has it, else the working tree's: a script the commit lacks runs on the commit's
  code, and fails if it needs something only the working tree has. `--script-from work`
  runs the working tree's script on the commit's code. pytest runs the commit's tests.
- **work**: the same command on the working tree as it is (uncommitted changes included).

Both sides use this virtualenv's installed dependencies and this tree's running stack
(`METASRV_STACK_DIR`: the worktree has no `.stack/` of its own). A benchmark that writes a result
file writes it to a temporary directory (`METASRV_BENCH_RESULTS`) or, for a base-side
script that predates that, inside the worktree; compare.py reads the figures, then the
worktree is removed (`--keep` keeps it).

The figures of a run are read from its standard output: a JSON document (a script's
`--json`; numbers by dotted path, short lists indexed, a list of objects also as each
field's median), the JSON file a `results: PATH` line names (load.py, takeover_load.py), or else
every `label: number` / `label   number` line and every `N words` item of a `label: ...,
...` line (purge_cycle.py's `median cycle`, the fault suite's `faults: ... 0 entries
lost`). compare.py prints, for each figure, the median over the runs of each side and
work / base, `--metric` keeping the figures whose name contains one of the words; it writes
the runs and the medians to one file, `benchmarks/results/compare-<figure>-<base>-<time>.json`
(or `--out`). It exits 1 if a run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _results import RESULTS_ENV, stamp, write_result

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
LABELLED = re.compile(
    rf"^\s*(?P<label>[A-Za-z][\w /().%<>=-]*?)\s*(?::\s*|\s{{2,}})(?P<value>{NUMBER})x?(?![\w.])"
)
"""`median cycle:    1.85 s` or `write_routes_s                 12.3`."""
KEYED = re.compile(rf"^\s*(?P<label>[A-Za-z_][\w.]*)\s+(?P<value>{NUMBER})\s*$")
"""`survivor_serves_after_kill_s 4.73` (a key, one space or more, a number, nothing else)."""
ITEM = re.compile(rf"^\s*(?P<value>{NUMBER}) (?P<label>[A-Za-z][A-Za-z ]*?)\s*$")
"""`12620 entries verified`, an item of `faults: 18 injected, ..., 12620 entries verified`."""
PYTEST_SUMMARY = re.compile(r"^[= ]*\d+ (?:passed|failed|skipped|deselected|errors?|x\w+)\b")
"""pytest's last line: `== 8 passed, 1 skipped in 312.20s ==`."""
PYTEST_ITEM = re.compile(r"(\d+) (\w+)")
STACK_ENV = "METASRV_STACK_DIR"
STACK = os.environ.get(STACK_ENV) or str(REPO / ".stack")
"""The services both sides use: this tree's stack (`metasrv stack up`), not one of the
worktree's own (its `.stack/` would be empty)."""
INDEXED = 12
"""Longest list whose items are figures of their own (longer ones: series, samples)."""
RESULTS_LINE = re.compile(r"^(?:results|JSON):\s*(?P<path>\S+\.json)\s*$", re.MULTILINE)


@dataclass
class Run:
    """One run of the figure on one side."""

    side: str
    command: list[str]
    product: str
    """Where its `metasrv` package was imported from (the proof of the side's code)."""
    returncode: int
    seconds: float
    figures: dict[str, float] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n", 1)[0],
        epilog=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", default="8cab7e3", help="the older commit (default 8cab7e3)")
    parser.add_argument("--runs", type=int, default=1, help="runs on each side (default 1)")
    parser.add_argument(
        "--metric",
        action="append",
        default=[],
        help="only figures whose name has WORD (repeatable)",
    )
    parser.add_argument(
        "--script-from",
        choices=("base", "work"),
        default="base",
        help="the base side's script: the commit's own (default, when it has it) or this tree's",
    )
    parser.add_argument("--keep", action="store_true", help="keep the worktree")
    parser.add_argument("--out", default=None, help="results file (default benchmarks/results/)")
    parser.add_argument("figure", nargs=argparse.REMAINDER, help="script or pytest, with args")
    args = parser.parse_args(argv)
    figure = args.figure[1:] if args.figure[:1] == ["--"] else args.figure
    if not figure:
        parser.error("name the figure: a benchmark script or pytest, with its arguments")
    base = git("rev-parse", "--short", args.base)
    work = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    runs: list[Run] = []
    with worktree(base, keep=args.keep) as tree:
        sides = {"base": tree, "work": REPO}
        for _ in range(args.runs):
            for side, root in sides.items():
                command = side_command(figure, root, side == "base" and args.script_from == "base")
                runs.append(run(side, command, root))
    medians = {side: median_figures([r for r in runs if r.side == side]) for side in sides}
    names = sorted(set(medians["base"]) | set(medians["work"]))
    if args.metric:
        names = [n for n in names if any(word in n for word in args.metric)]
    print_table(names, medians, base, work + (" (dirty)" if dirty else ""))
    result = {
        "figure": figure,
        "base": git("rev-parse", args.base),
        "work": git("rev-parse", "HEAD"),
        "work_dirty": dirty,
        "runs_per_side": args.runs,
        "script_from": args.script_from,
        "loadavg_end": os.getloadavg(),
        "medians": {
            n: {
                "base": medians["base"].get(n),
                "work": medians["work"].get(n),
                "work_over_base": ratio(medians["work"].get(n), medians["base"].get(n)),
            }
            for n in names
        },
        "runs": [vars(r) for r in runs],
    }
    name = Path(figure[1] if figure[0] == "pytest" and len(figure) > 1 else figure[0]).stem
    path = write_result(result, f"compare-{name}-{base}-{stamp()}.json", args.out)
    print(f"results: {path}")
    failed = [r for r in runs if r.returncode != 0]
    for r in failed:
        print(f"{r.side} run failed with {r.returncode}: {' '.join(r.command)}", file=sys.stderr)
    return 1 if failed else 0


def git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(commit: str, *, keep: bool) -> Iterator[Path]:
    """A detached `git worktree` of `commit` in a temporary directory."""
    path = Path(tempfile.mkdtemp(prefix=f"metasrv-compare-{commit}-"))
    path.rmdir()
    git("worktree", "add", "--detach", str(path), commit)
    try:
        yield path
    finally:
        if keep:
            print(f"worktree kept: {path}", file=sys.stderr)
        else:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO)
            shutil.rmtree(path, ignore_errors=True)


def side_command(figure: list[str], root: Path, own_script: bool) -> list[str]:
    """The command of one side: pytest, or the script (the side's copy when `own_script`
    and the side has it, else the working tree's)."""
    if figure[0] == "pytest":
        return [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", *figure[1:]]
    relative = (Path.cwd() / figure[0]).resolve().relative_to(REPO)
    path = root / relative if own_script and (root / relative).exists() else REPO / relative
    return [PYTHON, str(path), *figure[1:]]


def run(side: str, command: list[str], root: Path) -> Run:
    """Run `command` on `root`'s code; its output passes through (prefixed) and is read."""
    with tempfile.TemporaryDirectory(prefix="metasrv-compare-results-") as results:
        env = {**os.environ, "PYTHONPATH": str(root), RESULTS_ENV: results, STACK_ENV: STACK}
        probe = [PYTHON, "-c", "import metasrv; print(metasrv.__file__)"]
        product = subprocess.run(probe, cwd=root, env=env, capture_output=True, text=True)
        print(f"== {side} ({product.stdout.strip()}): {' '.join(command)}", file=sys.stderr)
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            sys.stderr.write(f"[{side}] {line}")
        returncode = proc.wait()
        output = "".join(lines)
        figures = read_figures(output, root)
    seconds = round(time.monotonic() - started, 1)
    return Run(side, command, product.stdout.strip(), returncode, seconds, figures)


def read_figures(output: str, root: Path) -> dict[str, float]:
    """The numbers a run reported (see the module's docstring), by name."""
    document = _json_document(output)
    if document is None:
        found = RESULTS_LINE.search(output)
        if found:
            path = Path(found["path"])
            path = path if path.is_absolute() else root / path
            with contextlib.suppress(OSError, ValueError):
                document = json.loads(path.read_text())
    if document is not None:
        return dict(_flatten(document))
    return _text_figures(output)


def _json_document(output: str) -> Any:
    text = output.strip()
    with contextlib.suppress(ValueError):
        return json.loads(text)
    last = [line for line in text.splitlines() if line.startswith(("{", "["))]
    if last:
        with contextlib.suppress(ValueError):
            return json.loads(last[-1])
    return None


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Numbers of a JSON document by dotted path. A list of up to `INDEXED` items is
    indexed (`windows.0.p99_ms`: load.py's first minute); a list of objects of any length
    also gives each numeric field's median (`memory_samples.median.leader_cpu_cores`)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        if len(value) <= INDEXED:
            for index, item in enumerate(value):
                yield from _flatten(item, f"{prefix}.{index}")
        rows = [dict(_flatten(item)) for item in value if isinstance(item, dict)]
        for key in sorted({k for row in rows for k in row}):
            numbers = [row[key] for row in rows if key in row]
            yield f"{prefix}.median.{key}", statistics.median(numbers)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        yield prefix, float(value)


def _text_figures(output: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for line in output.splitlines():
        if PYTEST_SUMMARY.match(line):
            counts = line.split(" in ")[0]
            figures.update((f"pytest {w}", float(n)) for n, w in PYTEST_ITEM.findall(counts))
            continue
        head, sep, rest = line.partition(":")
        items = [ITEM.match(part) for part in rest.split(",")] if sep and "," in rest else []
        if items and all(items):
            for item in filter(None, items):
                figures[f"{head.strip()} {item['label']}"] = _number(item["value"])
            continue
        found = LABELLED.match(line) or KEYED.match(line)
        if found:
            figures.setdefault(found["label"].strip(), _number(found["value"]))
    return figures


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def median_figures(runs: list[Run]) -> dict[str, float]:
    """Each figure's median over the runs that reported it."""
    names = {n for r in runs for n in r.figures}
    return {n: statistics.median(r.figures[n] for r in runs if n in r.figures) for n in names}


def ratio(work: float | None, base: float | None) -> float | None:
    if work is None or base is None or base == 0:
        return None
    return round(work / base, 3)


def print_table(
    names: list[str], medians: dict[str, dict[str, float]], base: str, work: str
) -> None:
    width = max([len(n) for n in names] + [6])
    print(f"{'figure'.ljust(width)}  {('base ' + base):>16}  {('work ' + work):>22}  work/base")
    for n in names:
        b, w = medians["base"].get(n), medians["work"].get(n)
        r = ratio(w, b)
        b_cell, w_cell = ("-" if v is None else f"{v:,.4g}" for v in (b, w))
        print(f"{n.ljust(width)}  {b_cell:>16}  {w_cell:>22}  {'-' if r is None else f'{r:.3f}'}")


if __name__ == "__main__":
    sys.exit(main())
