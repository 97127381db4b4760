"""How long a new leader takes to load the topic-region map, and what the event loop sees.

A process that wins an election serves nothing until `TopicRegionMap.load()` has read every
`__topic_region/...` key (DESIGN §2 invariant 3); at GreptimeDB's design load that is a
million routes. This writes N routes to etcd under a fresh key prefix (the layout and
region ids of `reconcile_snapshot.py`), then, in this process, times `TopicRegionMap.load()`
while a probe task measures the event loop's lag every 5 ms, as heartbeats would see it.

    python benchmarks/leader_map_load.py [--routes 1000000] [--json]

Uses the stack (`metasrv stack up`): its etcd (or METASRV_TEST_ETCD), and its Kafka address
for the admin client the topic-region map is built with (loading the map does not contact Kafka).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from typing import Any

from reconcile_snapshot import routes

from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.leader import TopicLocks, TopicRegionMap
from metasrv.settings import load_settings
from toolbox.stack import StackConfig, endpoints_of

PROBE = 0.005


async def timed_load(region_map: TopicRegionMap) -> dict[str, Any]:
    lags: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            before = time.monotonic()
            await asyncio.sleep(PROBE)
            lags.append(max(0.0, time.monotonic() - before - PROBE))

    task = asyncio.create_task(probe())
    t0 = time.perf_counter()
    loaded = await region_map.load()
    took = time.perf_counter() - t0
    done.set()
    await task
    lags.sort()
    return {
        "routes": loaded,
        "load_s": round(took, 2),
        "loop_lag_max_ms": round(1000 * lags[-1], 1) if lags else None,
        "loop_lag_p99_ms": round(1000 * lags[int(0.99 * (len(lags) - 1))], 1) if lags else None,
        "probes": len(lags),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--routes", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    endpoints = endpoints_of(StackConfig.from_env())
    endpoint = os.environ.get("METASRV_TEST_ETCD") or endpoints.etcd_endpoint
    prefix = f"bench-mapload-{uuid.uuid4().hex[:8]}/"
    kv = EtcdKv([endpoint], prefix, timeout=60)
    try:
        t0 = time.perf_counter()
        for batch in routes(args.routes):
            kv.batch_put(batch)
        write_s = time.perf_counter() - t0
        settings = load_settings(None, wal={"broker_endpoints": [endpoints.kafka_bootstrap]})
        region_map = TopicRegionMap(
            kv, KafkaAdmin(endpoints.kafka_bootstrap), TopicLocks(), settings
        )
        result = asyncio.run(timed_load(region_map))
        result["write_s"] = round(write_s, 1)
    finally:
        kv.delete_prefix("")
        kv.close()
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:18} {value}")


if __name__ == "__main__":
    main()
