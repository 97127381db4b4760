"""Heartbeat ingest: region stats/s one `metasrv start` process sustains, and the latency.

One daemon (uvicorn, one worker, SQLite kv by default) is started as a subprocess with
its topic-region map pre-written to the kv backend; simulated datanodes in separate
client processes (asyncio + httpx) each send heartbeats carrying `--regions` region
stats. Reported: accepted region stats/s over the measured window (client count,
cross-checked against the server's `metasrv_region_stats_received` counter), p50/p99
heartbeat latency, the server's CPU use, the raw `orjson.loads` rate of the same payload
(the parse ceiling) and the ratio to it, the rate of the handler's own typed msgspec decode
(faster than `orjson.loads`: it builds no dicts) and the ratio to that, plus the
in-process handler rate (no HTTP) and the memory of 1,000,000 tracked regions.

Two load shapes:
- open loop (default): every datanode sends `--rate` heartbeats/s at a fixed cadence
  (random phase), i.e. an offered load of nodes * rate * regions stats/s: what a fleet
  does, and the condition for the latency figures;
- `--rate 0`: closed loop, each datanode sends its next heartbeat as soon as the last
  one is answered: the saturation throughput (latency then only says how deep the queue is).

    python benchmarks/heartbeat_ingest.py [--nodes 50] [--regions 1000] [--rate 4]
        [--duration 20] [--clients 1] [--change 0.02] [--kv sqlite|etcd]
        [--client-impl httpx|raw] [--encoding json|columns] [--json]

`--encoding columns` sends the msgpack columns encoding (`metasrv.wire`) instead
of DESIGN §5 JSON; the in-process handler rate then measures `handle_columns`.

Targets: >= 200,000 region stats/s sustained, p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
from _metrics import loop_lag_summary, scrape, scrape_buckets
from _proc import cpu_seconds

from toolbox.simulator import MetasrvProcess, free_port, migrate, render_config

TARGET_STATS_PER_S = 200_000
TARGET_P99_MS = 50.0
STATS_RECEIVED = "metasrv_region_stats_received_total"
NUM_TOPICS = 64
TOPIC_PREFIX = "bench_wal"


def region_id(node: int, index: int) -> int:
    # table id = node + 1024, region number = index: the DESIGN §1 layout.
    return ((node + 1024) << 32) | index


def topic_of(node: int, index: int, regions: int) -> str:
    return f"{TOPIC_PREFIX}_{(node * regions + index) % NUM_TOPICS}"


def heartbeat_body(node: int, regions: int) -> dict[str, Any]:
    """A realistic heartbeat: some regions busy (memtable), some idle (topic latest)."""
    items = []
    for i in range(regions):
        idle = i % 4 == 0
        items.append(
            {
                "region_id": region_id(node, i),
                "topic": topic_of(node, i, regions),
                "flushed_entry_id": 1_000_000 + i * 37,
                "topic_latest_entry_id": 2_000_000 + i if idle else None,
                "memtable_bytes": 0 if idle else 4_194_304 + i,
                "manifest_version": 17,
            }
        )
    used = sorted({topic_of(node, i, regions) for i in range(regions)})
    topics = [
        {"topic": t, "latest_entry_id": 2_000_000, "record_size": 10_000_000, "record_num": 9_000}
        for t in used
    ]
    return {
        "node_id": node,
        "addr": f"10.0.0.{node % 250}:4001",
        "regions": items,
        "topics": topics,
    }


class ColumnsBody:
    """`heartbeat_body` in the columns encoding (`application/msgpack`), re-encoded per
    heartbeat from int64 arrays, as a datanode written against it would."""

    def __init__(self, body: dict[str, Any]) -> None:
        import numpy as np

        from metasrv.model import NULL

        regions = body["regions"]
        names = sorted({r["topic"] for r in regions})
        index = {t: i for i, t in enumerate(names)}

        def column(name: str) -> Any:
            return np.array([NULL if r[name] is None else r[name] for r in regions], dtype="<i8")

        self.flushed = column("flushed_entry_id")
        self._static = {
            name: column(name).tobytes()
            for name in ("region_id", "memtable_bytes", "topic_latest_entry_id", "manifest_version")
        }
        self._static["topic"] = np.array([index[r["topic"]] for r in regions], "<i8").tobytes()
        self._head = {k: body[k] for k in ("node_id", "addr", "topics")} | {"topic_names": names}

    def encode(self) -> bytes:
        import msgspec

        columns = {**self._static, "flushed_entry_id": self.flushed.tobytes()}
        return msgspec.msgpack.encode({**self._head, "regions": columns})


CONTENT_TYPES = {"json": "application/json", "columns": "application/msgpack"}


# --- client process -----------------------------------------------------------------------


class RawHttp:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: the lighter load generator
    (`--client-impl raw`), so more of the box's CPU is left to the server."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parsed = httpx.URL(url)
        self._host = parsed.host
        self._port = parsed.port or 80
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"POST /v1/heartbeat HTTP/1.1\r\nhost: {self._host}\r\n{extra}"
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, payload: bytes) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._conn
        writer.write(f"{self._head}content-length: {len(payload)}\r\n\r\n".encode())
        writer.write(payload)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await reader.readexactly(length)


async def run_clients(args: argparse.Namespace) -> None:
    """One client process: datanodes [first, last) against `args.url`; prints JSON samples."""
    first, last = (int(x) for x in args.node_range.split(":"))
    start_at = args.start_at
    end_at = start_at + args.duration
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    samples: list[tuple[float, float, int]] = []
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=last - first, max_keepalive_connections=last - first)
    headers = {"content-type": CONTENT_TYPES[args.encoding]}
    if args.token:
        headers["authorization"] = f"Bearer {args.token}"

    async with httpx.AsyncClient(base_url=args.url, limits=limits, timeout=30) as client:

        async def send(raw: RawHttp | None, payload: bytes) -> tuple[int, bytes]:
            if raw is not None:
                return await raw.post(payload)
            resp = await client.post("/v1/heartbeat", content=payload, headers=headers)
            return resp.status_code, resp.content

        async def datanode(node: int) -> None:
            raw = RawHttp(args.url, headers) if args.client_impl == "raw" else None
            body = heartbeat_body(node, args.regions)
            regions = body["regions"]
            columns = ColumnsBody(body) if args.encoding == "columns" else None
            rng = random.Random(node)
            changing = max(1, int(len(regions) * args.change)) if args.change > 0 else 0
            next_at = start_at + rng.random() * (interval or 0.01)
            while True:
                now = time.time()
                if interval:
                    if next_at > now:
                        await asyncio.sleep(next_at - now)
                    next_at += interval
                if time.time() >= end_at:
                    return
                # Regions flush over time: advance a slice of them per heartbeat.
                for _ in range(changing):
                    index = rng.randrange(len(regions))
                    if columns is not None:
                        columns.flushed[index] += 1
                    else:
                        regions[index]["flushed_entry_id"] += 1
                payload = orjson.dumps(body) if columns is None else columns.encode()
                sent = time.time()
                t0 = time.perf_counter()
                try:
                    status, content = await send(raw, payload)
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    raw = RawHttp(args.url, headers) if raw is not None else None
                    continue
                latency = time.perf_counter() - t0
                if status != 200:
                    errors[f"http_{status}"] = errors.get(f"http_{status}", 0) + 1
                    continue
                rejected = len(orjson.loads(content)["rejected"])
                samples.append((sent - start_at, latency, len(regions) - rejected))

        await asyncio.gather(*(datanode(n) for n in range(first, last)))
    cpu = time.process_time()
    sys.stdout.write(json.dumps({"samples": samples, "errors": errors, "cpu_seconds": cpu}))


# --- driver -------------------------------------------------------------------------------


def prepare_kv(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Write the topic-region map the daemon will load; return the [kv] section."""
    from metasrv import keys
    from metasrv.kv import EtcdKv, KvBackend, SqlKv

    kv: KvBackend
    if args.kv == "etcd":
        prefix = f"bench-{uuid.uuid4().hex[:8]}/"
        section = {"backend": "etcd", "etcd_endpoints": [args.etcd], "key_prefix": prefix}
        kv = EtcdKv(args.etcd, prefix)
    else:
        url = f"sqlite:///{workdir}/kv.db"
        section = {"backend": "sql", "sql_url": url}
        kv = SqlKv.open(url, create=True)
    items = [
        (
            keys.topic_region(topic_of(n, i, args.regions), region_id(n, i)),
            keys.encode_route(n, None),
        )
        for n in range(args.nodes)
        for i in range(args.regions)
    ]
    kv.batch_put(items)
    kv.close()
    return section


def cleanup_kv(section: dict[str, Any]) -> None:
    if section["backend"] == "etcd":
        from metasrv.kv import EtcdKv

        kv = EtcdKv(section["etcd_endpoints"], section["key_prefix"])
        kv.delete_prefix("")
        kv.close()


def write_config(path: Path, port: int, kv: dict[str, Any], args: argparse.Namespace) -> None:
    wal = {
        "broker_endpoints": [args.kafka],
        "num_topics": NUM_TOPICS,
        "topic_name_prefix": TOPIC_PREFIX,
        # Ingest only: no purge rounds (a new leader's first one runs as soon as every
        # region has reported, mid-run), on the baseline and on this code alike.
        "auto_prune_interval": "0s",
    }
    history = {"url": f"sqlite:///{path.parent}/history.db"}
    path.write_text(
        render_config(
            {"wal": wal, "http": {"addr": f"127.0.0.1:{port}"}, "kv": kv, "history": history}
        )
    )


def parse_ceiling(payload: bytes, seconds: float = 2.0) -> float:
    """Region stats/s `orjson.loads` alone reaches on this payload (one core)."""
    regions = len(orjson.loads(payload)["regions"])
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        orjson.loads(payload)
        count += 1
    return count * regions / (time.perf_counter() - start)


def decode_ceiling(payload: bytes, seconds: float = 2.0) -> float:
    """Region stats/s the handler's own typed decode (msgspec into its Structs, types and
    bounds checked) reaches alone on this payload (one core)."""
    from metasrv.wire import decode_json as _decode

    regions = len(_decode(payload).regions)
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        _decode(payload)
        count += 1
    return count * regions / (time.perf_counter() - start)


def handler_rate(args: argparse.Namespace, seconds: float = 3.0) -> float:
    """Region stats/s of `HeartbeatHandler.handle` in process: parse + validate + store."""
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

    async def run() -> float:
        settings = load_settings(None, wal={"broker_endpoints": [args.kafka]})
        kv = SqlKv.open("sqlite://", create=True)
        kv.batch_put(
            [
                (
                    keys.topic_region(topic_of(0, i, args.regions), region_id(0, i)),
                    keys.encode_route(0, None),
                )
                for i in range(args.regions)
            ]
        )
        registry, metrics = RegionRegistry(), Metrics()
        region_map = TopicRegionMap(kv, KafkaAdmin(args.kafka), TopicLocks(), settings)
        await region_map.load()
        handler = HeartbeatHandler(
            registry,
            region_map,
            Mailbox(registry),
            Checkpointer(region_map, registry, settings, metrics),
            metrics,
            leader_addr=lambda: "bench",
        )
        body = heartbeat_body(0, args.regions)
        columns = ColumnsBody(body) if args.encoding == "columns" else None
        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            if columns is not None:
                columns.flushed[count % args.regions] += 1
                handler.handle_columns(columns.encode())
            else:
                body["regions"][count % args.regions]["flushed_entry_id"] += 1
                handler.handle(orjson.dumps(body))
            count += 1
        kv.close()
        rate: float = count * args.regions / (time.perf_counter() - start)
        return rate

    return asyncio.run(run())


def registry_memory(n: int = 1_000_000) -> dict[str, float]:
    """Bytes per region held by the registry (stats, with the per-datanode region lists
    the heartbeat recalls) and the topic-region map (routes)."""
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from metasrv.leader import RegionRegistry
    from metasrv.model import RegionRoute, RegionStat
    from tests._stats import report

    topics = [f"{TOPIC_PREFIX}_{t}" for t in range(1024)]
    now = time.monotonic()
    stats: list[RegionStat] = []
    for i in range(n):
        flushed = 1_000_000 + i
        stats.append(
            RegionStat(
                (1024 + i // 1000) << 32 | i % 1000, i // 1000, topics[i % 1024], flushed,
                None if i % 4 else 2_000_000 + i, 4_194_304 + i, 17, now,
            )
        )  # fmt: skip
    gc.collect()
    tracemalloc.start()
    registry = RegionRegistry()
    # Stored through the heartbeat's judge: every datanode's first heartbeat, then a
    # steady one, which leaves the datanode's region list remembered for the next.
    report(registry, stats)
    report(registry, stats)
    stats_bytes = tracemalloc.get_traced_memory()[0]
    routes: dict[int, RegionRoute] = {}
    by_topic: dict[str, dict[int, RegionRoute]] = {}
    for topic in registry.topics():
        for rid, row in registry.topic_snapshot(topic).items():
            route = RegionRoute(
                region_id=rid, topic=row.topic, node_id=row.node_id, checkpoint_entry_id=None
            )
            routes[rid] = route
            by_topic.setdefault(route.topic, {})[rid] = route
    total = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {
        "registry_bytes_per_region": stats_bytes / n,
        "region_map_bytes_per_region": (total - stats_bytes) / n,
        "regions": n,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def drive(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="metasrv-bench-"))
    kv_section = prepare_kv(args, workdir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = workdir / "metasrv.toml"
    write_config(config, port, kv_section, args)
    # The history database migrated, as `metasrv start` expects in production.
    migrate(config, workdir / "migrate.log")
    server = MetasrvProcess(config, workdir / "metasrv.log", url, args=["--log-level", "warning"])
    clients: list[subprocess.Popen[bytes]] = []
    try:
        server.start(120)
        start_at = time.time() + 2.0  # let every client process connect first
        total = args.warmup + args.duration
        per = -(-args.nodes // args.clients)
        for c in range(args.clients):
            first, last = c * per, min(args.nodes, (c + 1) * per)
            if first >= last:
                continue
            clients.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--client",
                        "--url",
                        url,
                        "--node-range",
                        f"{first}:{last}",
                        "--regions",
                        str(args.regions),
                        "--rate",
                        str(args.rate),
                        "--change",
                        str(args.change),
                        "--duration",
                        str(total),
                        "--start-at",
                        str(start_at),
                        "--client-impl",
                        args.client_impl,
                        "--encoding",
                        args.encoding,
                    ],
                    stdout=subprocess.PIPE,
                )
            )
        time.sleep(max(0.0, start_at + args.warmup - time.time()))
        cpu0, stats0, t0 = (
            cpu_seconds(server.pid),
            scrape(url).get(STATS_RECEIVED, 0.0),
            time.time(),
        )
        lag0 = scrape_buckets(url)
        time.sleep(max(0.0, start_at + total - time.time()))
        cpu1, stats1, t1 = (
            cpu_seconds(server.pid),
            scrape(url).get(STATS_RECEIVED, 0.0),
            time.time(),
        )
        loop_lag = loop_lag_summary(lag0, scrape_buckets(url))
        results = [json.loads(p.communicate(timeout=120)[0]) for p in clients]
        client_cpu = sum(r["cpu_seconds"] for r in results) / total
    finally:
        for p in clients:
            if p.poll() is None:
                p.kill()
        server.stop(30)
        cleanup_kv(kv_section)

    window = [
        s
        for r in results
        for s in r["samples"]
        if args.warmup <= s[0] < args.warmup + args.duration
    ]
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    latencies = sorted(s[1] * 1000 for s in window)
    accepted = sum(s[2] for s in window)
    payload = orjson.dumps(heartbeat_body(0, args.regions))
    ceiling = parse_ceiling(payload)
    typed_ceiling = decode_ceiling(payload)
    sustained = accepted / args.duration
    server_rate = (stats1 - stats0) / (t1 - t0)
    server_cpu = (cpu1 - cpu0) / (t1 - t0)
    return {
        "nodes": args.nodes,
        "regions_per_heartbeat": args.regions,
        "mode": ("closed loop" if args.rate == 0 else f"open loop, {args.rate}/s per node")
        + f", {args.client_impl} client x{args.clients}",
        "offered_stats_per_s": None if args.rate == 0 else args.nodes * args.rate * args.regions,
        "kv": args.kv,
        "encoding": args.encoding,
        "payload_bytes": len(payload),
        "heartbeats": len(window),
        "stats_per_s": sustained,
        "server_counted_stats_per_s": server_rate,
        "server_cpu_cores": server_cpu,
        "stats_per_server_cpu_second": server_rate / server_cpu if server_cpu else None,
        "client_cpu_cores": client_cpu,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": latencies[-1] if latencies else None,
        "errors": errors,
        "server_event_loop_lag": loop_lag,
        "parse_ceiling_stats_per_s": ceiling,
        "ratio_to_parse_ceiling": sustained / ceiling,
        "decode_ceiling_stats_per_s": typed_ceiling,
        "ratio_to_decode_ceiling": sustained / typed_ceiling,
        "loadavg_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--regions", type=int, default=1000)
    parser.add_argument(
        "--rate", type=float, default=4.0, help="heartbeats/s per node; 0 = closed loop"
    )
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument(
        "--change",
        type=float,
        default=0.02,
        help="fraction of regions whose flushed id advances per heartbeat (each then "
        "needs a checkpoint write); 0.02 = every region flushes every ~12 s at 4/s",
    )
    parser.add_argument("--kv", choices=("sqlite", "etcd"), default="sqlite")
    parser.add_argument(
        "--encoding",
        choices=tuple(CONTENT_TYPES),
        default="json",
        help="heartbeat body: DESIGN §5 JSON, or the msgpack columns encoding",
    )
    parser.add_argument(
        "--client-impl",
        choices=("httpx", "raw"),
        default="httpx",
        help="load generator: httpx.AsyncClient, or a minimal asyncio HTTP/1.1 client",
    )
    parser.add_argument("--etcd", default=os.environ.get("METASRV_TEST_ETCD", "127.0.0.1:12379"))
    parser.add_argument("--kafka", default=os.environ.get("METASRV_TEST_KAFKA", "127.0.0.1:19092"))
    parser.add_argument("--skip-extras", action="store_true", help="no in-process rate / memory")
    parser.add_argument("--json", action="store_true")
    # Client-process mode (internal).
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--node-range", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.client:
        asyncio.run(run_clients(args))
        return 0

    report = drive(args)
    if not args.skip_extras:
        report["in_process_handler_stats_per_s"] = handler_rate(args)
        report.update(registry_memory())
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    r = report
    print(
        f"heartbeat ingest: {r['nodes']} datanodes x {r['regions_per_heartbeat']} regions, "
        f"{r['mode']}, kv={r['kv']}, {r['encoding']} body, JSON payload {r['payload_bytes']:,} B"
    )
    if r["offered_stats_per_s"]:
        print(f"  offered            {r['offered_stats_per_s']:>12,.0f} stats/s")
    counted = r["server_counted_stats_per_s"]
    print(
        f"  sustained          {r['stats_per_s']:>12,.0f} stats/s "
        f"(server counter {counted:,.0f}/s; target >= {TARGET_STATS_PER_S:,})"
    )
    print(
        f"  latency            p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
        f"max {r['max_ms']:.1f} ms (target p99 <= {TARGET_P99_MS:.0f} ms)"
    )
    print(
        f"  CPU                server {r['server_cpu_cores']:.2f} cores "
        f"({r['stats_per_server_cpu_second'] or 0:,.0f} stats per server CPU-second); "
        f"clients {r['client_cpu_cores']:.2f} cores"
    )
    print(
        f"  orjson.loads       {r['parse_ceiling_stats_per_s']:>12,.0f} stats/s "
        f"(ceiling); sustained/ceiling = {r['ratio_to_parse_ceiling']:.2f}"
    )
    print(
        f"  msgspec decode     {r['decode_ceiling_stats_per_s']:>12,.0f} stats/s "
        f"(the handler's typed decode alone); "
        f"sustained/decode = {r['ratio_to_decode_ceiling']:.2f}"
    )
    if "in_process_handler_stats_per_s" in r:
        rate = r["in_process_handler_stats_per_s"]
        print(f"  handler in-process {rate:>12,.0f} stats/s (parse+validate+store, no HTTP)")
        reg, topo = r["registry_bytes_per_region"], r["region_map_bytes_per_region"]
        print(
            f"  memory             {reg:.0f} B/region registry + {topo:.0f} B/region map "
            f"= {(reg + topo) * 1e6 / 2**20:.0f} MiB per 1,000,000 regions"
        )
    print(f"  event-loop lag     {r['server_event_loop_lag']}")
    if r["errors"]:
        print(f"  errors             {r['errors']}")
    print(f"  load average       {r['loadavg_1m']:.2f} (2-core box shared with other work)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
