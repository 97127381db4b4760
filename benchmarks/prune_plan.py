"""Prune planning at scale: 1,000,000 regions over 1,024 topics, target <= 1 s.

Times `procedures.wal_purge.plan_topic` for every topic over the topic-region map (routes
grouped by topic, as `TopicRegionMap.routes_by_topic()` holds them) and copies of the
leader's region stats, a topic at a time (`RegionRegistry.topic_snapshot`), median of
`--runs`. Every
region has a fresh stat except a few that are missing or stale, so the planner walks
every region. The baseline is the naive plan: for each topic, scan ALL regions for the
ones mapped to it. It is timed on `--baseline-topics` topics and extrapolated to all of
them (running it in full takes minutes); its plans are checked equal to the fast ones on
those topics.

    python benchmarks/prune_plan.py [--regions 1000000] [--topics 1024] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from metasrv.leader import RegionRegistry, TopicRows
from metasrv.model import PartitionOffsets, RegionRoute, RegionStat, TopicPlan
from procedures.wal_purge import plan_topic

sys.path.append(str(Path(__file__).resolve().parents[1]))
from tests._stats import report  # the heartbeats' write path

TARGET_SECONDS = 1.0
STAT_TTL = 30.0


def build(
    regions: int, topics: int
) -> tuple[dict[str, dict[int, RegionRoute]], RegionRegistry, dict[str, PartitionOffsets], float]:
    names = [f"wal_{t}" for t in range(topics)]
    now = time.monotonic()
    # As the topic-region map keeps them: topic -> {region id: route}.
    by_topic: dict[str, dict[int, RegionRoute]] = {t: {} for t in names}
    registry = RegionRegistry()
    stats: list[RegionStat] = []
    for i in range(regions):
        topic = names[i % topics]
        region_id = (1024 + i // 1000) << 32 | (i % 1000)
        by_topic[topic][region_id] = RegionRoute(region_id, topic, i % 50, None)
        if i % 99_991 == 0:
            continue  # a handful of regions never reported: their topics are blocked
        age = 100.0 if i % 199_999 == 0 else 1.0  # and a few are stale
        latest = 50_000 + i % 7 if i % 3 == 0 else None
        flushed = 10_000 + i % 10_000
        memtable = 0 if latest is not None else 1 << 20
        stats.append(RegionStat(region_id, i % 50, topic, flushed, latest, memtable, 3, now - age))
    report(
        registry, stats, {r: route for routes in by_topic.values() for r, route in routes.items()}
    )
    offsets = {t: PartitionOffsets(log_start_offset=5_000, high_watermark=60_000) for t in names}
    return by_topic, registry, offsets, now


def naive_plan(
    topic: str,
    all_routes: list[RegionRoute],
    stats: TopicRows,
    now: float,
    offsets: PartitionOffsets,
) -> TopicPlan:
    """The baseline: find the topic's regions by scanning every region."""
    mine = [r for r in all_routes if r.topic == topic]
    return plan_topic(
        topic, mine, stats, now=now, stat_ttl=STAT_TTL, pruned_entry_id=None, offsets=offsets
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--regions", type=int, default=1_000_000)
    parser.add_argument("--topics", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline-topics", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    by_topic, registry, offsets, now = build(args.regions, args.topics)
    build_s = time.perf_counter() - t0

    plan_times: list[float] = []
    snapshot_times: list[float] = []
    plans: dict[str, TopicPlan] = {}
    for _ in range(args.runs):
        start = time.perf_counter()
        # Each topic's rows copied, as the leader's purge round takes them.
        stats = {topic: registry.topic_snapshot(topic) for topic in by_topic}
        taken = time.perf_counter()
        plans = {
            topic: plan_topic(
                topic,
                routes,
                stats[topic],
                now=now,
                stat_ttl=STAT_TTL,
                pruned_entry_id=None,
                offsets=offsets.get(topic),
            )
            for topic, routes in by_topic.items()
        }
        done = time.perf_counter()
        snapshot_times.append(taken - start)
        plan_times.append(done - start)
    planned = sum(p.region_count for p in plans.values())
    assert planned == args.regions, (planned, args.regions)
    blocked = sum(1 for p in plans.values() if p.blocked_by)

    # Baseline on a few topics, extrapolated; the plans must agree.
    all_routes = [r for routes in by_topic.values() for r in routes.values()]
    stats = {topic: registry.topic_snapshot(topic) for topic in by_topic}
    sample = list(by_topic)[: args.baseline_topics]
    start = time.perf_counter()
    for topic in sample:
        rows = stats[topic]
        assert naive_plan(topic, all_routes, rows, now, offsets[topic]) == plans[topic]
    per_topic = (time.perf_counter() - start) / len(sample)
    baseline_s = per_topic * args.topics

    median = statistics.median(plan_times)
    report = {
        "regions": args.regions,
        "topics": args.topics,
        "runs": args.runs,
        "plan_seconds_median": median,
        "plan_seconds_all": plan_times,
        "snapshot_seconds_median": statistics.median(snapshot_times),
        "blocked_topics": blocked,
        "naive_seconds_estimated": baseline_s,
        "speedup": baseline_s / median,
        "build_seconds": build_s,
        "loadavg_1m": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    verdict = "meets" if median <= TARGET_SECONDS else "MISSES"
    print(f"prune plan: {args.regions:,} regions over {args.topics:,} topics, {args.runs} runs")
    snap = report["snapshot_seconds_median"]
    print(
        f"  plan_topic x topics median {median:.3f} s (snapshot {snap:.3f} s included); "
        f"{verdict} the {TARGET_SECONDS:.0f} s target"
    )
    print(f"  runs               {', '.join(f'{t:.3f}' for t in plan_times)} s")
    print(
        f"  naive baseline     ~{baseline_s:.0f} s (per-topic scan of all regions, "
        f"{args.baseline_topics} topics timed and extrapolated); speedup x{report['speedup']:.0f}"
    )
    print(f"  blocked topics     {blocked} (regions without or with stale stats)")
    print(f"  load average       {report['loadavg_1m']:.2f} (2-core box shared with other work)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
