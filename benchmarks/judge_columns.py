"""The leader's own cost of one columns heartbeat, in process: decode, check, judge.

Builds a registry holding every region of `--nodes` datanodes x `--regions` regions (the
steady state: every region already reported), encodes one msgpack columns heartbeat per
datanode with a third of the flushed ids advanced, and times `decode_columns` +
`columns_of` + `HeartbeatJudge.columns` over all of them (no HTTP, no storing, no
checkpoints, no other thread). It answers one question: is the per-heartbeat Python work
what limits the leader at the design load, or is it what runs beside it?

    python benchmarks/judge_columns.py [--nodes 50] [--regions 1000] [--runs 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

from metasrv import wire
from metasrv.leader import HeartbeatHandler, RegionRegistry
from metasrv.metrics import Metrics
from metasrv.model import RegionStat

sys.path.append(str(Path(__file__).resolve().parents[1]))
from tests._stats import report

TOPICS = 64
NODE_BASE = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--regions", type=int, default=1000, help="regions per datanode")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    def region_id(node: int, index: int) -> int:
        return ((NODE_BASE + node) << 32) | index

    def topic(node: int, index: int) -> str:
        return f"t_{(node * args.regions + index) % TOPICS}"

    registry = RegionRegistry()
    report(  # the first heartbeat of every datanode, judged and stored
        registry,
        [
            RegionStat(region_id(node, i), node, topic(node, i), 100, None, 10, None, 0.0)
            for node in range(args.nodes)
            for i in range(args.regions)
        ],
    )
    # Only the judge runs here: the map, mailbox and checkpointer are never touched.
    unused = cast(Any, None)
    handler = HeartbeatHandler(
        registry, unused, unused, unused, Metrics(), leader_addr=lambda: None
    )
    rng = random.Random(7)

    def row(node: int, i: int) -> tuple[int, str, int, int | None, int, int | None]:
        advanced = 1 if rng.random() < 0.33 else 0
        return (region_id(node, i), topic(node, i), 100 + advanced, None, 10, None)

    bodies = [
        (
            node,
            wire.encode_columns(
                node,
                None,
                [row(node, i) for i in range(args.regions)],
            ),
        )
        for node in range(args.nodes)
    ]

    def one_pass() -> float:
        started = time.perf_counter()
        for node, body in bodies:
            cols = wire.columns_of(wire.decode_columns(body))
            judged = handler.judge.columns(node, cols, 1.0)
            if judged.steady is None or len(judged.steady) != len(cols.region_id):
                raise SystemExit("a heartbeat left the steady-state path")
        return time.perf_counter() - started

    one_pass()  # warm-up
    per_heartbeat = [one_pass() / len(bodies) for _ in range(args.runs)]
    median = statistics.median(per_heartbeat)
    print(
        f"{args.regions}-region columns heartbeat, decode + checks + judge, in process: "
        f"median {median * 1e3:.3f} ms ({args.regions / median / 1e6:.2f} M region stats/s "
        f"on one core); the design load, 333 heartbeats/s, needs {333 * median:.2f} core for it"
    )


if __name__ == "__main__":
    main()
