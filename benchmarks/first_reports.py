"""A new term's first rounds of heartbeats, in process: what the leader spends judging and
storing them.

Writes `--nodes` x `--regions` routes (load.py's layout: 64 topics) into an in-memory SQLite
kv, loads the topic-region map as a new leader does, readies the term's stat table (sized
for the map and, where the code has it, `RegionRegistry.prepare`d from it), then hands
`HeartbeatHandler.handle_columns` one columns heartbeat per datanode, `--rounds` times.
Reported per round: the handler's total time, the median and p99 per heartbeat. Round 0 is
every region's first report to the new leader (no row yet); round 1 the second (no slot
recalled yet); later rounds the steady state. Then what a purge round reads on the event
loop: every topic's stat snapshot (`RegionRegistry.topic_snapshot`), the term's first pass
(which also sorts the first reports into the topics' member dicts) and a second one.

`PYTHONPATH=DIR` runs another checkout's code (a `git worktree` of an older commit) with
this script, for the baseline in the same run. No service is needed.

    python benchmarks/first_reports.py [--nodes 1000] [--regions 1000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from heartbeat_ingest import ColumnsBody, heartbeat_body, region_id, topic_of

import metasrv
from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import SqlKv
from metasrv.leader import (
    Checkpointer,
    HeartbeatHandler,
    Mailbox,
    RegionRegistry,
    TopicLocks,
    TopicRegionMap,
)
from metasrv.metrics import Metrics
from metasrv.settings import load_settings

UNUSED_BROKER = "127.0.0.1:1"
"""The map's Kafka admin is never called here: no topic is created or read."""


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    settings = load_settings(None, wal={"broker_endpoints": [UNUSED_BROKER]})
    kv = SqlKv.open("sqlite://", create=True)
    for node in range(args.nodes):
        kv.batch_put(
            [
                (
                    keys.topic_region(topic_of(node, i, args.regions), region_id(node, i)),
                    keys.encode_route(node, None),
                )
                for i in range(args.regions)
            ]
        )
    registry, metrics = RegionRegistry(), Metrics()
    region_map = TopicRegionMap(kv, KafkaAdmin(UNUSED_BROKER), TopicLocks(), settings)
    await region_map.load()
    gc.freeze()  # as a new leader does once its map is current (LeaderView)
    started = time.perf_counter()
    registry.reserve(len(region_map))
    prepare = getattr(registry, "prepare", None)
    if prepare is not None:
        prepare(region_map.routes_by_topic().items())
    ready_s = time.perf_counter() - started
    handler = HeartbeatHandler(
        registry,
        region_map,
        Mailbox(registry),
        Checkpointer(region_map, registry, settings, metrics),
        metrics,
        leader_addr=lambda: "bench",
    )
    bodies = [ColumnsBody(heartbeat_body(n, args.regions)).encode() for n in range(args.nodes)]
    rounds = []
    for _ in range(args.rounds):
        took = np.zeros(len(bodies))
        for i, body in enumerate(bodies):
            t0 = time.perf_counter()
            handler.handle_columns(body)
            took[i] = time.perf_counter() - t0
        ms = took * 1000
        rounds.append(
            {
                "total_ms": round(float(ms.sum()), 1),
                "median_ms": round(float(np.median(ms)), 3),
                "p99_ms": round(float(np.percentile(ms, 99)), 3),
            }
        )
    snapshots_ms = []
    topics = list(region_map.routes_by_topic())
    for _ in range(2):
        started = time.perf_counter()
        for topic in topics:
            registry.topic_snapshot(topic)
        snapshots_ms.append(round((time.perf_counter() - started) * 1000, 1))
    kv.close()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(metasrv.__file__).parent,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "code": commit,
        "nodes": args.nodes,
        "regions_per_node": args.regions,
        "term_ready_ms": round(ready_s * 1000, 1),
        "prepared": prepare is not None,
        "rounds": rounds,
        "topic_snapshots_ms": snapshots_ms,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--regions", type=int, default=1000, help="regions per datanode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"code {result['code']}: {args.nodes} x {args.regions} regions, term ready in "
        f"{result['term_ready_ms']} ms (prepared: {result['prepared']})"
    )
    for n, r in enumerate(result["rounds"]):
        print(
            f"round {n}: total {r['total_ms']} ms, per heartbeat median {r['median_ms']} ms, "
            f"p99 {r['p99_ms']} ms"
        )
    first, second = result["topic_snapshots_ms"]
    print(f"a purge round's topic snapshots: first pass {first} ms, second {second} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
