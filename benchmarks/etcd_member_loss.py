"""No-leader window when one member of a 3-member etcd dies or pauses (issue #23).

Two `metasrv start` processes run on the production-shaped cluster (`toolbox.stack.cluster_up`:
3 Kafka brokers, 3 etcd members) with `kv.backend = "etcd"` over all three members and a
5 s election lease. 1,000 regions (10 datanodes x 100, in the topic-region map before the
daemons start) heartbeat: every 100 ms one datanode's heartbeat goes to both daemons, so
each datanode reports once a second and a leader answers 200 ten times a second.

Faults, one at a time, each healed and settled before the next:

- `kill-follower` / `pause-follower`: an etcd follower that the leader's election does not use
  (when there is one);
- `kill-leader` / `pause-leader`: the etcd leader;
- `kill-election` / `pause-election`: the member the metasrv leader's election calls go to
  (from its log: "etcd election calls go to member ...").

SIGKILL is followed by 20 s of watching, SIGSTOP lasts 15 s and is followed by 8 s. The
figure is the longest time between two heartbeats answered 200 by some daemon, from the
fault to the end of the watch (0.1 s when nothing happened); other answers are counted by
status. Results go to `benchmarks/results/etcd_member_loss-<time>.json`; a table is printed.

    python benchmarks/etcd_member_loss.py [--rounds 1] [--faults kill-follower,...]

The machine is shared: the JSON records the load average next to the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _results import stamp, write_result

NODES = 10
REGIONS = 100
TOPICS = 4
NODE_BASE = 10_000
LEASE_SECS = 5
TICK = 0.1
"""Seconds between heartbeat rounds (one datanode's heartbeat to both daemons)."""
KILL_WATCH = 20.0
PAUSE_SECS = 15.0
PAUSE_WATCH = 8.0
FAULTS = (
    "kill-follower",
    "kill-leader",
    "kill-election",
    "pause-follower",
    "pause-leader",
    "pause-election",
)


def region_id(node: int, index: int) -> int:
    return ((NODE_BASE + node) << 32) | index


def topic_of(prefix: str, node: int, index: int) -> str:
    return f"{prefix}_wal_{(node * REGIONS + index) % TOPICS}"


def heartbeat_bodies(prefix: str) -> list[dict[str, Any]]:
    bodies = []
    for node in range(NODES):
        regions = [
            {
                "region_id": region_id(node, i),
                "topic": topic_of(prefix, node, i),
                "flushed_entry_id": -1,
                "topic_latest_entry_id": -1,
                "memtable_bytes": 0,
                "manifest_version": 1,
            }
            for i in range(REGIONS)
        ]
        used = sorted({str(r["topic"]) for r in regions})
        bodies.append(
            {
                "node_id": NODE_BASE + node,
                "addr": f"10.0.{node}.1:4001",
                "regions": regions,
                "topics": [
                    {"topic": t, "latest_entry_id": -1, "record_size": 0, "record_num": 0}
                    for t in used
                ],
            }
        )
    return bodies


@dataclass
class Poller:
    """Heartbeats to every daemon on a thread of its own; records who answered what."""

    urls: list[str]
    bodies: list[dict[str, Any]]
    ok_times: list[float] = field(default_factory=list)
    """Monotonic times of answers 200 (from any daemon)."""
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    """(time, daemon index, status or error name) of every answer."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _one(self, client: httpx.AsyncClient, i: int, body: dict[str, Any]) -> None:
        try:
            response = await client.post(f"{self.urls[i]}/v1/heartbeat", json=body)
            outcome = str(response.status_code)
            if response.status_code == 200:
                self.ok_times.append(time.monotonic())
            elif response.status_code >= 500:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    outcome += f" {response.json()['error']['code']}"
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        self.answers.append((time.monotonic(), i, outcome))

    async def _run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(timeout=2.0) as client:
            n = 0
            next_at = time.monotonic()
            while not self._stop.is_set():
                body = self.bodies[n % len(self.bodies)]
                n += 1
                for i in range(len(self.urls)):
                    task = asyncio.create_task(self._one(client, i, body))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                next_at += TICK
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await asyncio.gather(*tasks, return_exceptions=True)

    def longest_gap(self, start: float, end: float) -> float:
        """Longest time between answers 200 from `start` to `end` (the last 200 before
        `start` opens the first gap)."""
        times = sorted(self.ok_times)
        before = [t for t in times if t < start]
        points = ([before[-1]] if before else [start]) + [t for t in times if start <= t <= end]
        points.append(end)
        return max(b - a for a, b in itertools.pairwise(points))

    def counts(self, start: float, end: float) -> dict[str, int]:
        return dict(Counter(o for t, _, o in self.answers if start <= t <= end and o != "200"))


def leader_index(urls: list[str]) -> int | None:
    for i, url in enumerate(urls):
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if httpx.get(f"{url}/readyz", timeout=1.0).json().get("is_leader") is True:
                return i
    return None


def election_member(log: Path) -> str | None:
    """The member the daemon's election calls go to, from its last log line saying so."""
    from toolbox.simulator import log_records

    member = None
    for _, record in log_records(log):
        if record.get("etcd_channel") == "election":
            member = record.get("etcd_member", member)
    return member


def wait_settled(poller: Poller, urls: list[str], seconds: float = 3.0) -> None:
    """Until some daemon leads and heartbeats have been answered 200 for `seconds`."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = time.monotonic()
        if leader_index(urls) is not None and poller.longest_gap(now - seconds, now) < 0.5:
            return
        time.sleep(0.5)
    raise RuntimeError("the daemons did not settle (no leader answering heartbeats)")


@contextlib.contextmanager
def daemons(workdir: Path, kafka: str, etcd: list[str], prefix: str) -> Iterator[list[Any]]:
    """Two `metasrv start -c FILE` children on every etcd member."""
    import migrations
    from toolbox.simulator import MetasrvProcess, free_port, render_config

    history_url = f"sqlite:///{workdir / 'history.db'}"
    migrations.upgrade(history_url)
    procs = []
    try:
        for n in range(2):
            port = free_port()
            config = workdir / f"metasrv-{n}.toml"
            config.write_text(
                render_config(
                    {
                        "wal": {
                            "broker_endpoints": kafka.split(","),
                            "num_topics": TOPICS,
                            "topic_name_prefix": f"{prefix}_wal",
                            "auto_prune_interval": "1h",
                        },
                        "http": {"addr": f"127.0.0.1:{port}"},
                        "kv": {
                            "backend": "etcd",
                            "etcd_endpoints": etcd,
                            "key_prefix": f"{prefix}/",
                        },
                        "history": {"url": history_url, "stats_url": str(workdir / "stats")},
                        "election": {"node_name": f"metasrv-{n}", "lease_secs": LEASE_SECS},
                    }
                )
            )
            proc = MetasrvProcess(config, workdir / f"metasrv-{n}.log", f"http://127.0.0.1:{port}")
            procs.append(proc)
            proc.start(ready_timeout=180, expect_leader=n == 0)
        yield procs
    finally:
        for proc in procs:
            proc.stop(timeout=30)


def run_fault(fault: str, cluster: Any, procs: list[Any], poller: Poller) -> dict[str, Any]:
    urls = [p.url for p in procs]
    wait_settled(poller, urls)
    members = dict(zip(cluster.etcd_endpoints, cluster.etcd_members, strict=True))
    lead = leader_index(urls)
    assert lead is not None
    election = members.get(election_member(procs[lead].log_path) or "")
    etcd_leader = cluster.etcd_leader()
    kind, target = fault.split("-", 1)
    if target == "leader":
        member = etcd_leader
    elif target == "election":
        member = election or etcd_leader
    else:
        followers = [m for m in cluster.etcd_members if m != etcd_leader]
        member = next((m for m in followers if m != election), followers[0])
    row: dict[str, Any] = {
        "fault": fault,
        "member": member,
        "etcd_leader": etcd_leader,
        "election_member": election,
        "metasrv_leader_before": lead,
    }
    start = time.monotonic()
    try:
        if kind == "kill":
            cluster.kill(member)
            time.sleep(KILL_WATCH)
        else:
            cluster.pause(member)
            time.sleep(PAUSE_SECS)
            cluster.resume(member)
            time.sleep(PAUSE_WATCH)
    finally:
        end = time.monotonic()
        cluster.heal()
    row["no_leader_s"] = round(poller.longest_gap(start, end), 2)
    row["other_answers"] = poller.counts(start, end)
    row["metasrv_leader_after"] = leader_index(urls)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    for f in faults:
        if f not in FAULTS:
            parser.error(f"unknown fault {f!r}; expected some of {', '.join(FAULTS)}")

    from metasrv import keys
    from metasrv.kafka import KafkaAdmin
    from metasrv.kv import EtcdKv
    from toolbox.stack import StackConfig, cluster_up

    cluster = cluster_up(StackConfig.from_env())
    prefix = f"etcdloss{uuid.uuid4().hex[:6]}"
    workdir = Path(tempfile.mkdtemp(prefix="metasrv-etcd-loss-"))
    admin = KafkaAdmin(cluster.kafka_bootstrap)
    kv = EtcdKv(cluster.etcd_endpoints, f"{prefix}/", timeout=30)
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "regions": NODES * REGIONS,
            "datanodes": NODES,
            "heartbeat_round_s": TICK,
            "lease_secs": LEASE_SECS,
            "etcd_endpoints": cluster.etcd_endpoints,
            "kill_watch_s": KILL_WATCH,
            "pause_s": PAUSE_SECS,
            "pause_watch_s": PAUSE_WATCH,
            "cpus": os.cpu_count(),
        },
        "loadavg_before": os.getloadavg(),
        "faults": [],
    }
    poller = None
    try:
        admin.ensure_topics([f"{prefix}_wal_{n}" for n in range(TOPICS)])
        kv.batch_put(
            [
                (
                    keys.topic_region(topic_of(prefix, n, i), region_id(n, i)),
                    keys.encode_route(NODE_BASE + n, None),
                )
                for n in range(NODES)
                for i in range(REGIONS)
            ]
        )
        with daemons(workdir, cluster.kafka_bootstrap, cluster.etcd_endpoints, prefix) as procs:
            poller = Poller([p.url for p in procs], heartbeat_bodies(prefix))
            poller.start()
            for _ in range(args.rounds):
                for fault in faults:
                    row = run_fault(fault, cluster, procs, poller)
                    result["faults"].append(row)
                    gap, answers = row["no_leader_s"], row["other_answers"]
                    print(f"{fault:<15} {row['member']:<7} no leader {gap:6.2f} s  {answers}")
            poller.stop()
    finally:
        if poller is not None:
            poller.stop()
        cluster.heal()
        with contextlib.suppress(Exception):
            kv.delete_prefix("")
        with contextlib.suppress(Exception):
            admin.delete_topics(t for t in admin.list_topics() if t.startswith(f"{prefix}_"))
        kv.close()
        admin.close()
        if args.keep:
            print(f"workdir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["loadavg_after"] = os.getloadavg()
    out = write_result(result, f"etcd_member_loss-{stamp()}.json")
    print_table(result["faults"])
    print(f"results: {out}")


def print_table(rows: list[dict[str, Any]]) -> None:
    by_fault: dict[str, list[float]] = {}
    for row in rows:
        by_fault.setdefault(row["fault"], []).append(row["no_leader_s"])
    print(f"\n{'fault':<16}{'runs':>5}{'no leader min':>15}{'max':>8}")
    for fault, gaps in by_fault.items():
        print(f"{fault:<16}{len(gaps):>5}{min(gaps):>13.2f} s{max(gaps):>6.2f} s")


if __name__ == "__main__":
    main()
