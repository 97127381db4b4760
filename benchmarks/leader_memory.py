"""Leader memory by design: bytes per tracked region, and the record-size state per
(topic, datanode) over a long run.

Two figures (tracemalloc, in process; memory, not time, so a busy machine does not skew them):
- bytes per tracked region at 100,000 and 1,000,000 regions: the registry's stored rows plus
  the map's routes (`heartbeat_ingest.registry_memory`, values as the decoder builds them);
- the topic record-size state of 1,000 datanodes x 64 topics, after 1 and after 20 reports per
  (topic, datanode): O(1) state means the two are equal (the sample windows it replaced grew
  to 512 samples per pair, ~515 MB in the 10-minute load run).

    python benchmarks/leader_memory.py [--regions 100000,1000000] [--json]

Target (issue #11): <= 1 KB per tracked region including the region_map.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from typing import Any

from heartbeat_ingest import registry_memory

from metasrv.leader import RegionRegistry

TARGET_BYTES_PER_REGION = 1024


def topic_state_bytes(nodes: int, topics: int, reports: int) -> int:
    """Bytes the registry holds for topic reports after `reports` per (topic, datanode)."""
    gc.collect()
    tracemalloc.start()
    registry = RegionRegistry()
    for step in range(reports):
        now = step * 3.0
        for node in range(nodes):
            for t in range(topics):
                count = step * 1_000 + node
                registry.report_topic(node, f"wal_{t}", count, count * 512, count, now)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--regions", default="100000,1000000")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {"per_region": {}, "target_bytes_per_region": TARGET_BYTES_PER_REGION}
    for n in (int(x) for x in args.regions.split(",")):
        m = registry_memory(n)
        m["total_bytes_per_region"] = (
            m["registry_bytes_per_region"] + m["region_map_bytes_per_region"]
        )
        report["per_region"][n] = m
    pairs = args.nodes * args.topics
    one = topic_state_bytes(args.nodes, args.topics, 1)
    many = topic_state_bytes(args.nodes, args.topics, 20)
    report["topic_state"] = {
        "pairs": pairs,
        "bytes_after_1_report": one,
        "bytes_after_20_reports": many,
        "bytes_per_pair": round(many / pairs, 1),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for n, m in report["per_region"].items():
        print(
            f"{n:>9,} regions: {m['registry_bytes_per_region']:.0f} B registry + "
            f"{m['region_map_bytes_per_region']:.0f} B region_map = "
            f"{m['total_bytes_per_region']:.0f} B per region (target <= {TARGET_BYTES_PER_REGION})"
        )
    s = report["topic_state"]
    print(
        f"topic record-size state, {args.nodes} datanodes x {args.topics} topics: "
        f"{s['bytes_after_1_report'] / 2**20:.1f} MiB after 1 report per pair, "
        f"{s['bytes_after_20_reports'] / 2**20:.1f} MiB after 20 ({s['bytes_per_pair']} B/pair)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
