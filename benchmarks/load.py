"""Load run: 1,000 datanodes x 100 regions heartbeating a leader and a follower for 10 minutes.

Two `metasrv start` processes (leader + follower) run on the shared etcd and Kafka under a
unique key prefix and topic prefix. The topic-region map of the 100,000 synthetic regions
is written to etcd before the daemons start (the DESIGN §4 layout, as registrations leave
it); their DESIGN §5 heartbeats come from load generators in separate processes that send
pre-encoded bodies over raw keep-alive connections (`_load_gen.py`, which says how its CPU
is measured; `--generator httpx` runs the asyncio + httpx generator below instead). A
handful of simulated datanodes (toolbox.simulator, registered through `POST /v1/regions`)
write real WAL records and flush, so the synthetic regions follow real high watermarks and
the leader's purges really delete.

Synthetic regions: a quarter are idle (report `topic_latest_entry_id` = the topic's latest
id as last read from Kafka), the rest busy (`flushed_entry_id` a little behind it, a
memtable). Each heartbeat advances a `--change` fraction of a node's regions; stats never
go backwards. Some heartbeats go to the follower, which must answer 421 naming the leader.

Reported: heartbeats accepted (200) and rejected (non-200, by status) with region-level
rejections by reason, p50/p99/p99.9 latency, heartbeats/s and region stats/s achieved vs
offered, leader and follower RSS (and CPU) sampled every 10 s from /proc, purges completed
and entries deleted, checkpoint keys written, the follower's 421s. Results go to
`benchmarks/results/load-<time>.json`; a table is printed.

    python benchmarks/load.py [--duration 600] [--nodes 1000] [--regions 100]
        [--interval 3] [--clients 2] [--change 0.05] [--prune-interval 30s]
        [--encoding json|columns] [--generator raw|httpx]

The machine is shared: the JSON records the load average next to the figures.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import gc
import json
import os
import random
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _load_gen
import httpx
import orjson
from _metrics import loop_lag_summary, scrape, scrape_buckets
from _proc import cpu_seconds, rss_mib
from _results import stamp, write_result

from metasrv.datanode import Backoff
from metasrv.model import NULL

NODE_BASE = 10_000
"""Synthetic datanode ids start here (the simulated writers use 0..n)."""
IDLE_EVERY = 4
"""Every 4th synthetic region is idle."""
HW_REFRESH = 5.0
"""Seconds between a load generator's reads of the topics' high watermarks."""
SAMPLE_EVERY = 10.0
"""Seconds between RSS/CPU samples of the daemons."""


def region_id(node: int, index: int) -> int:
    """DESIGN §1 layout: table id = NODE_BASE + node, region number = index."""
    return ((NODE_BASE + node) << 32) | index


def topic_of(prefix: str, node: int, index: int, regions: int, topics: int) -> str:
    return f"{prefix}_wal_{(node * regions + index) % topics}"


# --- load generator (client process) ------------------------------------------------------


COLUMN_FIELDS = (
    "region_id",
    "flushed_entry_id",
    "memtable_bytes",
    "topic_latest_entry_id",
    "manifest_version",
)
CONTENT_TYPES = {"json": "application/json", "columns": "application/msgpack"}
JSON_HEADERS = {"content-type": "application/json"}


class Fleet:
    """The synthetic regions of one load generator and the high watermarks they follow."""

    def __init__(self, args: argparse.Namespace, first: int, last: int) -> None:
        self.args = args
        self.rng = random.Random(first)
        self.topics = [f"{args.prefix}_wal_{n}" for n in range(args.topics)]
        self.latest: dict[str, int] = dict.fromkeys(self.topics, -1)
        self.bodies: dict[int, dict[str, Any]] = {}
        self._cols: dict[int, dict[str, Any]] = {}
        self._names: dict[int, list[str]] = {}
        for node in range(first, last):
            regions: list[dict[str, Any]] = []
            for i in range(args.regions):
                regions.append(
                    {
                        "region_id": region_id(node, i),
                        "topic": topic_of(args.prefix, node, i, args.regions, args.topics),
                        "flushed_entry_id": -1,
                        "topic_latest_entry_id": -1 if i % IDLE_EVERY == 0 else None,
                        "memtable_bytes": 0,
                        "manifest_version": 1,
                    }
                )
            used = sorted({str(r["topic"]) for r in regions})
            self.bodies[node] = {
                "node_id": NODE_BASE + node,
                "addr": f"10.{node // 250}.{node % 250}.1:4001",
                "regions": regions,
                "topics": [
                    {"topic": t, "latest_entry_id": -1, "record_size": 0, "record_num": 0}
                    for t in used
                ],
            }

    def refresh(self, admin: Any) -> None:
        """Read every topic's high watermark (blocking; run in a thread)."""
        for topic, offsets in admin.offsets(self.topics).items():
            self.latest[topic] = max(self.latest[topic], offsets.high_watermark - 1)

    def advance(self, region: dict[str, Any]) -> None:
        latest = self.latest[region["topic"]]
        if region["topic_latest_entry_id"] is not None:
            region["topic_latest_entry_id"] = max(region["topic_latest_entry_id"], latest)
        else:
            lag = self.rng.randint(0, 50)
            region["flushed_entry_id"] = max(region["flushed_entry_id"], latest - lag)
            region["memtable_bytes"] = self.rng.randint(1024, 4 << 20)
            region["manifest_version"] += 1

    def payload(self, node: int) -> bytes:
        """The node's next heartbeat: a `change` fraction of its regions moved forward."""
        body = self.bodies[node]
        regions = body["regions"]
        count = max(1, round(len(regions) * self.args.change))
        moved = self.rng.sample(range(len(regions)), count)
        for index in moved:
            self.advance(regions[index])
        for report in body["topics"]:
            report["latest_entry_id"] = self.latest[report["topic"]]
        if self.args.encoding == "json":
            return orjson.dumps(body)
        return self._columns(node, body, moved)

    def _columns(self, node: int, body: dict[str, Any], moved: list[int]) -> bytes:
        """The same heartbeat in the msgpack columns encoding (`metasrv.wire`):
        int64 arrays kept per node, only the moved regions copied in per heartbeat."""
        import msgspec
        import numpy as np

        regions = body["regions"]
        cols = self._cols.get(node)
        if cols is None:
            names = sorted({r["topic"] for r in regions})
            index = {t: i for i, t in enumerate(names)}
            cols = self._cols[node] = {
                "topic": np.array([index[r["topic"]] for r in regions], "<i8"),
                **{f: np.zeros(len(regions), "<i8") for f in COLUMN_FIELDS},
            }
            self._names[node] = names
            moved = list(range(len(regions)))
        for i in moved:
            region = regions[i]
            for name in COLUMN_FIELDS:
                value = region[name]
                cols[name][i] = NULL if value is None else value
        wire = {k: v.tobytes() for k, v in cols.items()}
        head = {k: body[k] for k in ("node_id", "addr", "topics")}
        return msgspec.msgpack.encode({**head, "topic_names": self._names[node], "regions": wire})

    def prime(self) -> None:
        """Every region observed once (after the first high watermark read)."""
        for body in self.bodies.values():
            for region in body["regions"]:
                self.advance(region)


async def run_client(args: argparse.Namespace) -> None:
    """One load-generator process; writes its stats to `args.out_file` (+ `.lat`)."""
    from metasrv.kafka import KafkaAdmin

    first, last = (int(x) for x in args.node_range.split(":"))
    fleet = Fleet(args, first, last)
    admin = KafkaAdmin(args.kafka)
    await asyncio.to_thread(fleet.refresh, admin)
    fleet.prime()
    stats = _load_gen.Stats()
    start_at, end_at = args.start_at, args.start_at + args.duration
    headers = {"content-type": CONTENT_TYPES[args.encoding]}
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    stop = asyncio.Event()

    async def refresher() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                await asyncio.to_thread(fleet.refresh, admin)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HW_REFRESH)

    # One client (one connection) per datanode, as real datanodes have: httpx's pool scans
    # its connections per request, so one shared pool of hundreds of connections costs the
    # generator more CPU than the server spends. They share one SSL context (unused over
    # http://, but httpx builds one per client otherwise, loading the CA bundle each time).
    tls = ssl.create_default_context()
    async with contextlib.AsyncExitStack() as clients:
        per_node = {
            node: await clients.enter_async_context(
                httpx.AsyncClient(base_url=args.url, limits=limits, timeout=30, verify=tls)
            )
            for node in range(first, last)
        }
        # The fleet's bodies and the clients live for the whole run: move them out of the
        # collector's reach, so this process's own GC pauses do not show up as server
        # latency (gen-2 passes over them took tens to hundreds of ms).
        gc.collect()
        gc.freeze()

        async def datanode(node: int) -> None:
            client = per_node[node]
            rng = random.Random(node)
            next_at = start_at + rng.random() * args.interval
            while True:
                now = time.time()
                if next_at > now:
                    await asyncio.sleep(next_at - now)
                elif now - next_at > args.interval:
                    # The generator fell a whole interval behind: skip, and say so.
                    skipped = int((now - next_at) // args.interval)
                    stats.missed += skipped
                    next_at += skipped * args.interval
                if time.time() >= end_at:
                    return
                next_at += args.interval
                payload = fleet.payload(node)
                sent = time.time()
                t0 = time.perf_counter()
                try:
                    resp = await client.post("/v1/heartbeat", content=payload, headers=headers)
                except httpx.HTTPError as exc:
                    stats.error(type(exc).__name__)
                    continue
                latency = time.perf_counter() - t0
                if resp.status_code != 200:
                    key = f"http_{resp.status_code}"
                    if resp.status_code == 421:
                        # As a datanode does: go to the leader the 421 names (if it names
                        # another one; "unknown" or itself means an election is under way).
                        named = resp.json()["error"].get("leader")
                        if named and f"http://{named}" != str(client.base_url).rstrip("/"):
                            client.base_url = httpx.URL(f"http://{named}")
                            stats.leader_switches += 1
                    stats.error(key, sent - start_at)
                    continue
                body = orjson.loads(resp.content)
                stats.ok += 1
                stats.region_stats += args.regions - len(body["rejected"])
                for item in body["rejected"]:
                    reason = str(item.get("reason"))
                    stats.rejected_regions[reason] = stats.rejected_regions.get(reason, 0) + 1
                stats.times.append(sent - start_at)
                stats.latencies.append(latency)

        async def follower() -> None:
            if not args.follower_url or args.follower_rate <= 0:
                return
            counts = stats.follower
            async with httpx.AsyncClient(base_url=args.follower_url, timeout=10) as other:
                await asyncio.sleep(max(0.0, start_at - time.time()))
                while time.time() < end_at:
                    payload = orjson.dumps(fleet.bodies[first])
                    try:
                        resp = await other.post(
                            "/v1/heartbeat", content=payload, headers=JSON_HEADERS
                        )
                    except httpx.HTTPError as exc:
                        key = type(exc).__name__
                    else:
                        key = f"http_{resp.status_code}"
                        if resp.status_code == 421:
                            named = resp.json()["error"].get("leader")
                            ok = named == args.leader_addr
                            key = "421_names_leader" if ok else "421_other_leader"
                    counts[key] = counts.get(key, 0) + 1
                    await asyncio.sleep(1.0 / args.follower_rate)

        hw = asyncio.create_task(refresher())
        cpu0 = time.process_time()
        await asyncio.gather(follower(), *(datanode(n) for n in range(first, last)))
        stop.set()
        await hw
    admin.close()
    stats.write(args.out_file, "httpx", {"cpu_seconds": time.process_time() - cpu0})


# --- driver -----------------------------------------------------------------------------


class Sampler:
    """RSS and CPU of the daemons every `SAMPLE_EVERY` seconds, in a thread."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._t0 = self._last = time.time()
        self._cpu: dict[str, float] = {}

    def start(self) -> None:
        self._t0 = self._last = time.time()
        self._cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.sample()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self.sample()

    def sample(self) -> None:
        """RSS now, and CPU cores used since the previous sample."""
        now = time.time()
        row: dict[str, float] = {"t": round(now - self._t0, 1), "loadavg": os.getloadavg()[0]}
        dt = now - self._last
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                row[f"{name}_rss_mb"] = round(rss_mib(pid), 1)
                cpu = cpu_seconds(pid)
                row[f"{name}_cpu_cores"] = round((cpu - self._cpu[name]) / dt, 3) if dt > 0 else 0
                self._cpu[name] = cpu
        self._last = now
        self.samples.append(row)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def read_latencies(path: Path, count: int) -> tuple[list[float], list[float]]:
    times: array.array[float] = array.array("d")
    latencies: array.array[float] = array.array("d")
    with path.open("rb") as fh:
        times.fromfile(fh, count)
        latencies.fromfile(fh, count)
    return list(times), list(latencies)


@contextlib.contextmanager
def daemons(
    args: argparse.Namespace, workdir: Path, kafka: str, etcd: str, history_url: str
) -> Iterator[tuple[Any, Any]]:
    """Leader then follower, both `metasrv start -c FILE` children."""
    from toolbox.simulator import MetasrvProcess, free_port, render_config

    procs = []
    try:
        for role in ("leader", "follower"):
            port = free_port()
            config = workdir / f"{role}.toml"
            config.write_text(
                render_config(
                    {
                        "wal": {
                            "broker_endpoints": [kafka],
                            "num_topics": args.topics,
                            "topic_name_prefix": f"{args.prefix}_wal",
                            "auto_prune_interval": args.prune_interval,
                            "flush_trigger_size": "1MB",
                        },
                        "http": {"addr": f"127.0.0.1:{port}"},
                        "kv": {
                            "backend": "etcd",
                            "etcd_endpoints": [etcd],
                            "key_prefix": f"{args.prefix}/",
                        },
                        # One stat history for both roles, as in production.
                        "history": {"url": history_url, "stats_url": str(workdir / "stats")},
                        "election": {"node_name": role},
                    }
                )
            )
            proc = MetasrvProcess(config, workdir / f"{role}.log", f"http://127.0.0.1:{port}")
            procs.append(proc)
            proc.start(ready_timeout=300, expect_leader=role == "leader")
        yield procs[0], procs[1]
    finally:
        for proc in procs:
            proc.stop(timeout=30)


def drive(args: argparse.Namespace) -> dict[str, Any]:
    import migrations
    from metasrv import keys
    from metasrv.kafka import KafkaAdmin
    from metasrv.kv import EtcdKv
    from toolbox.simulator import Workload, WorkloadConfig
    from toolbox.stack import ensure_up

    if args.kafka and args.etcd:
        kafka, etcd = args.kafka, args.etcd
    else:
        endpoints = ensure_up()
        kafka, etcd = args.kafka or endpoints.kafka_bootstrap, args.etcd or endpoints.etcd_endpoint
    args.prefix = f"load{uuid.uuid4().hex[:6]}"
    workdir = Path(tempfile.mkdtemp(prefix="metasrv-load-"))
    topics = [f"{args.prefix}_wal_{n}" for n in range(args.topics)]
    admin = KafkaAdmin(kafka)
    kv = EtcdKv([etcd], f"{args.prefix}/", timeout=30)
    total_regions = args.nodes * args.regions
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "nodes": args.nodes,
            "regions_per_node": args.regions,
            "regions": total_regions,
            "heartbeat_interval_s": args.interval,
            "change_fraction": args.change,
            "duration_s": args.duration,
            "topics": args.topics,
            "client_processes": args.clients,
            "encoding": args.encoding,
            "generator": args.generator,
            "prune_interval": args.prune_interval,
            "writers": f"{args.writer_nodes} simulated datanodes x {args.writer_regions} regions, "
            f"{args.write_rate:g} rows/s",
            "kafka": kafka,
            "etcd": etcd,
            "cpus": os.cpu_count(),
        },
    }
    clients: list[subprocess.Popen[bytes]] = []
    workload = None
    try:
        admin.ensure_topics(topics)
        t0 = time.monotonic()
        kv.batch_put(
            [
                (
                    keys.topic_region(
                        topic_of(args.prefix, n, i, args.regions, args.topics), region_id(n, i)
                    ),
                    keys.encode_route(NODE_BASE + n, None),
                )
                for n in range(args.nodes)
                for i in range(args.regions)
            ]
        )
        result["register_s"] = round(time.monotonic() - t0, 1)
        history_url = f"sqlite:///{workdir / 'history.db'}"
        migrations.upgrade(history_url)
        with daemons(args, workdir, kafka, etcd, history_url) as (leader, follower):
            t0 = time.monotonic()
            result["follower_sees_leader_s"] = wait_follower(follower.url, leader.url)
            result["leader_serves_s"] = wait_serving(leader.url)
            leader_addr = leader.url.removeprefix("http://")
            workload = Workload(
                WorkloadConfig(
                    nodes=args.writer_nodes,
                    regions_per_node=args.writer_regions,
                    write_rate=args.write_rate,
                    row_bytes=200,
                    flush_threshold_bytes=16 * 1024,
                    slow_fraction=0.0,
                    idle_fraction=0.125,
                    heartbeat_interval=args.interval,
                ),
                kafka_bootstrap=kafka,
                data_dir=workdir / "writers",
                metasrv_url=leader.url,
            )
            workload.setup()
            workload.start()
            assert leader.proc is not None and follower.proc is not None
            sampler = Sampler({"leader": leader.proc.pid, "follower": follower.proc.pid})
            start_at = time.time() + 5.0  # every client process loads its fleet first
            per = -(-args.nodes // args.clients)
            for c in range(args.clients):
                first, last = c * per, min(args.nodes, (c + 1) * per)
                if first >= last:
                    continue
                argv = [
                    sys.executable,
                    __file__,
                    "--client",
                    "--url",
                    leader.url,
                    "--leader-addr",
                    leader_addr,
                    "--node-range",
                    f"{first}:{last}",
                    "--out-file",
                    str(workdir / f"client-{c}.json"),
                    "--start-at",
                    str(start_at),
                    "--kafka",
                    kafka,
                    "--prefix",
                    args.prefix,
                    *_shared_flags(args),
                ]
                if c == 0:
                    argv += ["--follower-url", follower.url]
                clients.append(subprocess.Popen(argv))
            time.sleep(max(0.0, start_at - time.time()))
            sampler.start()
            metrics0 = scrape(leader.url)
            lag0 = scrape_buckets(leader.url)
            for proc in clients:
                proc.wait(timeout=args.duration + 300)
            sampler.stop()
            metrics1 = scrape(leader.url)
            result["leader_event_loop_lag"] = loop_lag_summary(lag0, scrape_buckets(leader.url))
            workload.check()
            result["writers_rows_written"] = workload.written
            workload.close()
            workload = None
            result.update(collect(args, workdir, clients, sampler, metrics0, metrics1, start_at))
            result.update(purge_totals(history_url))
        result["leadership_events"] = leadership_events(workdir)
    finally:
        for proc in clients:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if workload is not None:
            workload.close()
        with contextlib.suppress(Exception):
            kv.delete_prefix("")
        with contextlib.suppress(Exception):
            admin.delete_topics(t for t in admin.list_topics() if t.startswith(f"{args.prefix}_"))
        kv.close()
        admin.close()
        if args.keep:
            print(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def _shared_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--nodes",
        str(args.nodes),
        "--regions",
        str(args.regions),
        "--topics",
        str(args.topics),
        "--interval",
        str(args.interval),
        "--change",
        str(args.change),
        "--duration",
        str(args.duration),
        "--follower-rate",
        str(args.follower_rate),
        "--encoding",
        args.encoding,
        "--generator",
        args.generator,
    ]


def wait_follower(follower: str, leader: str, timeout: float = 60.0) -> float:
    """Seconds until the follower names the leader."""
    t0 = time.monotonic()
    want = leader.removeprefix("http://")
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if httpx.get(f"{follower}/v1/leader", timeout=5).json().get("leader") == want:
                return round(time.monotonic() - t0, 1)
        time.sleep(0.2)
    raise SystemExit("the follower never learned the leader's address")


def wait_serving(url: str, timeout: float = 300.0) -> float:
    """Seconds until the leader serves: a new leader answers 503 while it loads the map."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v1/regions", params={"limit": 1}, timeout=30).is_success:
                return round(time.monotonic() - t0, 1)
        time.sleep(0.2)
    raise SystemExit("the leader never served")


def collect(
    args: argparse.Namespace,
    workdir: Path,
    clients: list[subprocess.Popen[bytes]],
    sampler: Sampler,
    metrics0: dict[str, float],
    metrics1: dict[str, float],
    start_at: float,
) -> dict[str, Any]:
    ok = 0
    errors: dict[str, int] = {}
    rejected: dict[str, int] = {}
    follower: dict[str, int] = {}
    region_stats = missed = switches = 0
    error_times: list[float] = []
    client_cpu = 0.0
    times: list[float] = []
    latencies: list[float] = []
    for c, proc in enumerate(clients):
        if proc.returncode != 0:
            raise SystemExit(f"load generator {c} exited with {proc.returncode}")
        data = json.loads((workdir / f"client-{c}.json").read_text())
        ok += data["ok"]
        region_stats += data["region_stats"]
        missed += data["missed"]
        switches += data["leader_switches"]
        error_times += data["error_times"]
        client_cpu += data["cpu_seconds"]
        for target, source in (
            (errors, data["errors"]),
            (rejected, data["rejected_regions"]),
            (follower, data["follower"]),
        ):
            for k, v in source.items():
                target[k] = target.get(k, 0) + v
        t, lat = read_latencies(workdir / f"client-{c}.lat", data["count"])
        times += t
        latencies += lat
    ms = sorted(x * 1000 for x in latencies)
    offered = args.nodes / args.interval
    windows = []
    step = 60.0 if args.duration >= 180 else max(10.0, args.duration / 6)
    w = 0.0
    while w < args.duration:
        inside = sorted(
            lat * 1000 for t, lat in zip(times, latencies, strict=True) if w <= t < w + step
        )
        windows.append(
            {
                "from_s": w,
                "heartbeats_per_s": round(len(inside) / step, 1),
                "p50_ms": percentile(inside, 0.5),
                "p99_ms": percentile(inside, 0.99),
            }
        )
        w += step
    failed = sum(errors.values())
    delta = {k: metrics1.get(k, 0.0) - metrics0.get(k, 0.0) for k in metrics1}
    leader_rss = [s["leader_rss_mb"] for s in sampler.samples if "leader_rss_mb" in s]
    rss_60 = next(
        (s["leader_rss_mb"] for s in sampler.samples if s["t"] >= 60 and "leader_rss_mb" in s),
        None,
    )
    return {
        "heartbeats_sent": ok + failed,
        "heartbeats_accepted": ok,
        "heartbeats_rejected": failed,
        "rejections_by_status": errors,
        "region_stats_accepted": region_stats,
        "region_stats_rejected": rejected,
        "heartbeats_per_s": round(ok / args.duration, 1),
        "offered_heartbeats_per_s": round(offered, 1),
        "region_stats_per_s": round(region_stats / args.duration, 1),
        "generator_missed_sends": missed,
        "generator_leader_switches": switches,
        "rejected_at_s": _spans(sorted(error_times)),
        "generator_cpu_cores": round(client_cpu / args.duration, 3),
        "latency_ms": {
            "p50": percentile(ms, 0.5),
            "p99": percentile(ms, 0.99),
            "p999": percentile(ms, 0.999),
            "max": ms[-1] if ms else None,
        },
        "latency_by_window": windows,
        "follower_heartbeats": follower,
        "memory_samples": sampler.samples,
        "leader_rss_mb": {
            "start": leader_rss[0] if leader_rss else None,
            "end": leader_rss[-1] if leader_rss else None,
            "max": max(leader_rss) if leader_rss else None,
            "at_60s": rss_60,
            "end_over_60s": round(leader_rss[-1] / rss_60, 3) if leader_rss and rss_60 else None,
        },
        "leader_counters": {
            "heartbeats_received": delta.get("metasrv_heartbeats_received_total"),
            "region_stats_received": delta.get("metasrv_region_stats_received_total"),
            "checkpoint_keys_written": delta.get("metasrv_checkpoint_keys_written_total"),
            "flush_instructions_sent": delta.get("metasrv_flush_instructions_sent_total"),
            "purge_step_errors": delta.get("metasrv_wal_purge_errors_total"),
            "purges": delta.get("metasrv_wal_purges_total"),
        },
        "loadavg_1m_end": os.getloadavg()[0],
    }


def _spans(times: list[float], gap: float = 5.0) -> list[list[float]]:
    """[first, last] second of each burst of rejected heartbeats (bursts split by `gap`)."""
    spans: list[list[float]] = []
    for t in times:
        if spans and t - spans[-1][1] <= gap:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return spans


def leadership_events(workdir: Path) -> list[dict[str, Any]]:
    """Elections and step-downs the daemons logged, in time order."""
    from toolbox.simulator import log_records

    events = [
        {"ts": record["ts"], "process": role, "event": msg, "reason": record.get("reason")}
        for role in ("leader", "follower")
        for msg in ("elected leader", "leadership lost")
        for _, record in log_records(workdir / f"{role}.log", msg)
        if record["msg"] == msg
    ]
    return sorted(events, key=lambda e: str(e["ts"]))


def purge_totals(history_url: str) -> dict[str, Any]:
    from sqlalchemy import create_engine, func, select

    from metasrv.sql import purge_history_table

    engine = create_engine(history_url)
    try:
        with engine.connect() as conn:
            count, deleted, topics = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(purge_history_table.c.entries_deleted), 0),
                    func.count(func.distinct(purge_history_table.c.topic)),
                )
            ).one()
    finally:
        engine.dispose()
    return {"purges_completed": count, "entries_deleted": deleted, "topics_purged": topics}


def print_table(result: dict[str, Any]) -> None:
    lat = result["latency_ms"]
    cfg = result["config"]

    def fmt(value: Any) -> str:
        return (
            "-" if value is None else (f"{value:.1f}" if isinstance(value, float) else str(value))
        )

    rows = [
        (
            "regions (nodes x regions)",
            f"{cfg['regions']} ({cfg['nodes']} x {cfg['regions_per_node']})",
        ),
        ("duration", f"{cfg['duration_s']:g} s, heartbeat every {cfg['heartbeat_interval_s']:g} s"),
        ("heartbeats accepted", fmt(result["heartbeats_accepted"])),
        (
            "heartbeats rejected",
            f"{result['heartbeats_rejected']} {result['rejections_by_status']}",
        ),
        ("region stats rejected", fmt(result["region_stats_rejected"])),
        (
            "heartbeats/s (offered)",
            f"{result['heartbeats_per_s']} ({result['offered_heartbeats_per_s']})",
        ),
        ("region stats/s", fmt(result["region_stats_per_s"])),
        (
            "latency p50 / p99 / p99.9",
            f"{fmt(lat['p50'])} / {fmt(lat['p99'])} / {fmt(lat['p999'])} ms",
        ),
        ("latency max", f"{fmt(lat['max'])} ms"),
        (
            "leader RSS start / end / max",
            "{} / {} / {} MB".format(
                *(fmt(result["leader_rss_mb"][k]) for k in ("start", "end", "max"))
            ),
        ),
        (
            "leader RSS end / at 60 s",
            fmt(result["leader_rss_mb"]["end_over_60s"]),
        ),
        ("leader event-loop lag", fmt(result.get("leader_event_loop_lag"))),
        ("generator CPU (cores)", fmt(result["generator_cpu_cores"])),
        ("purges completed", f"{result['purges_completed']} ({result['entries_deleted']} entries)"),
        ("follower answers", fmt(result["follower_heartbeats"])),
        ("generator missed sends", fmt(result["generator_missed_sends"])),
        ("rejections at (s)", fmt(result["rejected_at_s"])),
        (
            "leadership events",
            "; ".join(
                f"{e['ts'][11:19]} {e['process']} {e['event']}"
                + (f" ({e['reason']})" if e["reason"] else "")
                for e in result["leadership_events"]
            ),
        ),
        ("load average (1 min, end)", fmt(result["loadavg_1m_end"])),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    print("every 10 s: leader RSS MB / follower RSS MB, leader CPU cores, load average")
    for s in result["memory_samples"]:
        print(
            f"  {s['t']:>6}s: {fmt(s.get('leader_rss_mb'))} / {fmt(s.get('follower_rss_mb'))}, "
            f"{s.get('leader_cpu_cores', 0):.2f}, {s['loadavg']:.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--regions", type=int, default=100, help="regions per datanode")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between heartbeats")
    parser.add_argument("--change", type=float, default=0.05, help="regions moved per heartbeat")
    parser.add_argument("--topics", type=int, default=64)
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument(
        "--encoding",
        choices=tuple(CONTENT_TYPES),
        default="json",
        help="heartbeat body: DESIGN §5 JSON, or the msgpack columns encoding",
    )
    parser.add_argument(
        "--generator",
        choices=("raw", "httpx"),
        default="raw",
        help="load generator: pre-encoded bodies over raw connections, or asyncio + httpx",
    )
    parser.add_argument("--follower-rate", type=float, default=2.0, help="heartbeats/s to it")
    parser.add_argument(
        "--cap-jitter",
        type=float,
        default=Backoff().cap_jitter,
        help="raw generator's datanodes' Backoff cap_jitter (1: full jitter at the cap too)",
    )
    parser.add_argument("--prune-interval", default="30s")
    parser.add_argument("--writer-nodes", type=int, default=4)
    parser.add_argument("--writer-regions", type=int, default=8)
    parser.add_argument("--write-rate", type=float, default=200.0, help="rows/s, all writers")
    parser.add_argument("--kafka", default=None, help="default: the shared stack's")
    parser.add_argument("--etcd", default=None, help="default: the shared stack's")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--url", "--urls", "--leader-addr", "--node-range", "--out-file", "--prefix"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--follower-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        if args.generator == "raw":
            _load_gen.run(args)
        else:
            asyncio.run(run_client(args))
        return 0
    result = drive(args)
    out = write_result(result, f"load-{stamp()}.json", args.out)
    print_table(result)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
