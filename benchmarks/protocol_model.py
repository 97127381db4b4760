"""The exhaustive protocol model's search (tests/procedures/wal_purge/protocol_model): states
explored and seconds, per world, at the bound `make test` runs (`small`) or the larger one
(`large`, the slow test's).

Each world is searched whole (every reachable state, the liveness check on each); the
counterexamples found are counted by kind (the known product gaps are strict xfails in
tests/procedures/wal_purge/test_protocol_model.py). Results go to
`benchmarks/results/protocol_model-<bound>-<time>.json`; a table is printed.

    python benchmarks/protocol_model.py [--bound small|large] [--world purge,idle,...]
        [--no-liveness]

The machine is shared: the JSON records the load average next to the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Appended, not inserted: a `PYTHONPATH` tree (compare.py's older commit) comes first.
sys.path.append(str(ROOT))

from _results import stamp, write_result  # noqa: E402

from tests.procedures.wal_purge.protocol_model import (  # noqa: E402
    IDLE_REPLAY,
    LARGE,
    SMALL,
    Bounds,
    search,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", choices=("small", "large"), default="small")
    parser.add_argument("--world", default="", help="comma list (default: every world)")
    parser.add_argument("--no-liveness", action="store_true", help="skip the liveness check")
    args = parser.parse_args()
    worlds: dict[str, Bounds] = dict(SMALL if args.bound == "small" else LARGE)
    if args.bound == "small":
        worlds["idle_replay"] = IDLE_REPLAY
    if args.world:
        worlds = {name: worlds[name] for name in args.world.split(",")}
    rows = []
    total_states, total_seconds = 0, 0.0
    for name, bounds in worlds.items():
        result = search(bounds, stop_at_first=False, liveness=not args.no_liveness)
        kinds = sorted({c.violation.split(":")[0] for c in result.counterexamples})
        rows.append(
            {
                "world": name,
                "bounds": bounds.describe(),
                "states": result.states,
                "transitions": result.transitions,
                "seconds": round(result.seconds, 2),
                "complete": result.complete,
                "counterexample_kinds": kinds,
            }
        )
        total_states += result.states
        total_seconds += result.seconds
        print(
            f"{name:12s} {result.states:>10,d} states {result.transitions:>11,d} transitions "
            f"{result.seconds:7.1f} s  {', '.join(kinds) or 'no counterexample'}",
            flush=True,
        )
    print(f"{'total':12s} {total_states:>10,d} states {'':>23s} {total_seconds:7.1f} s")
    summary = {
        "bound": args.bound,
        "liveness": not args.no_liveness,
        "loadavg": os.getloadavg(),
        "worlds": rows,
        "total_states": total_states,
        "total_seconds": round(total_seconds, 2),
    }
    path = write_result(summary, f"protocol_model-{args.bound}-{stamp(utc=True)}.json")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
