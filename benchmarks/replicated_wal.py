"""Issue 23's Kafka-side figures, black-box, on the 3-broker RF 3 cluster.

One `metasrv start` daemon (etcd kv on every cluster member, all three brokers,
`replication_factor = 3`, no ticker: purges are `POST /v1/purge`) is started from the code of
`--checkout` (default: this repository). `benchmarks/compare.py` runs it side by side with
an older commit:

    .venv/bin/python benchmarks/replicated_wal.py --scenario follower-paused --runs 1
    .venv/bin/python benchmarks/compare.py --base 1ef582f -- benchmarks/replicated_wal.py

The benchmark drives regions over HTTP (`POST /v1/regions`, `POST /v1/heartbeat`, DESIGN §5),
produces real records (acks=all) and reads Kafka with its own admin client. Scenarios:

- `follower-paused`: 200 records; region A idle (flushed 10, topic latest 199), region B
  flushed 149; a follower of the partition SIGSTOPped; one purge. Every 50 ms: Kafka's log
  start, then A's replay-start. Figures: purge completion time, time replay-start < log
  start and the largest gap; after SIGCONT the log start must be 149.
- `leader-killed`: the partition leader SIGKILLed; every 2 s: produce, heartbeat further
  flushed ids, `POST /v1/purge`. Figure: Kafka electing a new leader -> the first purge that
  succeeded and moved the log start (capped at `--leader-cap` s), with the outcomes and plan
  answers in between.
- `broker-down-cpu`: 10 topics, regions heartbeating every 3 s; daemon CPU over 30 s with
  every broker up, then with one broker killed; figure: cores above idle.
- `produce-while-purging`: producer throughput (1 KiB, acks=all, 20 s) with the daemon
  purging the topic every 100 ms vs not purging (heartbeats every 100 ms in both), and with
  the benchmark's own client calling DeleteRecords every 100 ms instead of the daemon
  (Kafka's share of the cost, without the daemon's CPU); the daemon's CPU in each phase.

The cluster comes from `toolbox.stack.cluster_up` (started if needed) and is healed after
every scenario run. Each daemon has its own topic and key prefix, removed afterwards. A
table goes to stdout and JSON to benchmarks/results/replicated-wal-<sha>-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from _daemon import daemon_sections, remove_keys, wal_section
from _proc import cpu_seconds
from _produce import produce_for
from _results import (
    Figures,
    host,
    log,
    print_table,
    product_tree,
    run_scenarios,
    save_run,
)
from confluent_kafka import KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from toolbox.simulator import MetasrvProcess, free_port, metasrv_argv, render_config

if TYPE_CHECKING:
    from toolbox.stack import Cluster

SCENARIOS = ("follower-paused", "leader-killed", "broker-down-cpu", "produce-while-purging")
TERMINAL = {"succeeded", "skipped", "failed", "cancelled"}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of one name summed)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            name = (task / "comm").read_text().strip()
            out[name] = out.get(name, 0.0) + cpu_seconds(pid, int(task.name))
    return out


# --- Kafka, from outside ----------------------------------------------------------------


class Kafka:
    """The benchmark's own Kafka clients (never the daemon's)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin = self._new_admin()

    def _new_admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 5000})

    def log_start(self, topic: str, timeout: float = 2.0) -> int | None:
        """Partition 0's log start from its leader; None when it cannot be read now (an
        error or a negative offset; the admin client is rebuilt so the next read starts
        from fresh metadata)."""
        part = TopicPartition(topic, 0)
        try:
            # OffsetSpec's factories carry no annotations in confluent-kafka's own stubs.
            spec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
            futures = self._admin.list_offsets({part: spec}, request_timeout=timeout)
            offset = int(futures[part].result(timeout + 1).offset)
        except Exception:
            offset = -1
        if offset < 0:
            self._admin = self._new_admin()
            return None
        return offset

    def partition(self, topic: str, timeout: float = 2.0) -> tuple[int, list[int], list[int]]:
        """(leader, replicas, isr) of partition 0 from a fresh metadata request."""
        md = self._admin.list_topics(topic, timeout=timeout)
        part = md.topics[topic].partitions[0]
        return int(part.leader), [int(r) for r in part.replicas], [int(r) for r in part.isrs]

    def delete_below(self, topic: str, offset: int, timeout: float = 5.0) -> None:
        """DeleteRecords(topic, 0, offset); errors are the caller's to count."""
        part = TopicPartition(topic, 0, offset)
        futures = self._admin.delete_records([part], request_timeout=timeout)
        futures[part].result(timeout + 1)

    def delete_topics(self, topics: list[str]) -> None:
        if not topics:
            return
        futures = self._admin.delete_topics(topics, operation_timeout=30)
        for topic, future in futures.items():
            try:
                future.result(60)
            except KafkaException as exc:
                log(f"cleanup: topic {topic}: {exc}")

    def producer(self, **extra: Any) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "acks": "all", **extra})

    def produce(self, topic: str, count: int, size: int = 100, timeout: float = 30.0) -> int:
        """Append `count` records (acks=all); the last offset written. Raises if any fails."""
        producer = self.producer(**{"linger.ms": 5})
        last = -1
        failed: list[str] = []

        def done(err: Any, msg: Message) -> None:
            nonlocal last
            if err is not None:
                failed.append(str(err))
            else:
                last = max(last, int(msg.offset() or 0))

        payload = b"x" * size
        for _ in range(count):
            producer.produce(topic, value=payload, partition=0, on_delivery=done)
        if producer.flush(timeout) != 0 or failed:
            raise RuntimeError(f"records not delivered to {topic}: {failed[:3]}")
        return last


# --- the daemon ---------------------------------------------------------------------------


class Api:
    """DESIGN §5 over HTTP, as plain JSON (the same contract for every checkout)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30.0)

    def close(self) -> None:
        self.http.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise RuntimeError(
                f"{response.request.method} {response.request.url.path}: "
                f"{response.status_code} {response.text[:300]}"
            )
        return response.json()

    def register(self, region_id: int, node_id: int, topic: str) -> None:
        body = {"region_id": region_id, "node_id": node_id, "topic": topic}
        self._json(self.http.post("/v1/regions", json=body))

    def heartbeat(self, node_id: int, regions: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"node_id": node_id, "addr": None, "regions": regions, "topics": []}
        answer: dict[str, Any] = self._json(self.http.post("/v1/heartbeat", json=body))
        if answer.get("rejected"):
            raise RuntimeError(f"heartbeat rejected: {answer['rejected']}")
        return answer

    def purge(self, topic: str, timeout: float = 30.0) -> list[str]:
        body = {"topics": [topic], "dry_run": False}
        ids: list[str] = self._json(self.http.post("/v1/purge", json=body, timeout=timeout))[
            "procedure_ids"
        ]
        return ids

    def purge_all(self) -> list[str]:
        body = {"topics": None, "dry_run": False}
        ids: list[str] = self._json(self.http.post("/v1/purge", json=body))["procedure_ids"]
        return ids

    def procedure(self, procedure_id: str, timeout: float = 10.0) -> dict[str, Any]:
        view: dict[str, Any] = self._json(
            self.http.get(f"/v1/procedures/{procedure_id}", timeout=timeout)
        )
        return view

    def wait(self, procedure_id: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last = "unasked"
        while True:
            try:
                view = self.procedure(procedure_id)
                if view["state"] in TERMINAL:
                    return view
                last = view["state"]
            except (RuntimeError, httpx.HTTPError) as exc:  # a 503 while etcd fails over
                last = str(exc)[:200]
            if time.monotonic() > deadline:
                raise TimeoutError(f"procedure {procedure_id} still {last}")
            time.sleep(0.1)

    def replay_start(self, region_id: int) -> int:
        answer = self._json(self.http.get(f"/v1/regions/{region_id}/replay-start", timeout=5.0))
        return int(answer["start_entry_id"])

    def plan(self, topic: str, timeout: float = 60.0) -> dict[str, Any]:
        answer = self._json(
            self.http.get("/v1/purge/plan", params={"topic": topic}, timeout=timeout)
        )
        plan: dict[str, Any] = answer["topics"][0]
        return plan


def region(
    region_id: int, topic: str, flushed: int, latest: int | None = None, memtable: int = 1 << 20
) -> dict[str, Any]:
    """One DESIGN §5 `regions[]` entry; `latest` given means an idle region (memtable 0)."""
    return {
        "region_id": region_id,
        "topic": topic,
        "flushed_entry_id": flushed,
        "topic_latest_entry_id": latest,
        "memtable_bytes": 0 if latest is not None else memtable,
        "manifest_version": 1,
    }


class Daemon:
    """One `metasrv start -c FILE` child running the code of a checkout."""

    def __init__(self, bench: Bench, label: str, num_topics: int) -> None:
        self.bench = bench
        self.prefix = f"rwal{uuid.uuid4().hex[:8]}_{label}"
        self.num_topics = num_topics
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = bench.workdir / f"{self.prefix}.toml"
        self.log_path = bench.workdir / f"{self.prefix}.log"
        self.process = MetasrvProcess(
            self.config, self.log_path, self.url, env=bench.env, cwd=bench.checkout
        )
        self.api = Api(self.url)
        cluster = bench.cluster
        wal = {**wal_section(cluster, self.prefix, num_topics), "auto_prune_interval": "0s"}
        addr = f"127.0.0.1:{self.port}"
        sections = daemon_sections(cluster, bench.workdir, self.prefix, addr, wal)
        self.config.write_text(render_config(sections))

    @property
    def topics(self) -> list[str]:
        return [f"{self.prefix}_{n}" for n in range(self.num_topics)]

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, timeout: float = 120.0) -> None:
        env = self.bench.env
        upgrade = subprocess.run(
            metasrv_argv("db", "upgrade", "-c", str(self.config)),
            cwd=self.bench.checkout,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if upgrade.returncode != 0:
            raise RuntimeError(f"db upgrade failed: {upgrade.stdout}{upgrade.stderr}")
        self.process.start(timeout)

    def stop(self) -> None:
        self.api.close()
        self.process.stop(20)

    def cleanup(self) -> None:
        """Remove the daemon's topics and its etcd keys."""
        self.bench.kafka.delete_topics(self.topics)
        remove_keys(self.bench.cluster, self.prefix)


class Heartbeater:
    """A datanode in a thread: `regions()` reported every `every` seconds."""

    def __init__(
        self,
        api: Api,
        node_id: int,
        regions: Callable[[], list[dict[str, Any]]],
        every: float,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.api, self.node_id, self.regions, self.every, self.tick = (
            api,
            node_id,
            regions,
            every,
            tick,
        )
        self.sent = 0
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Heartbeater:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.api.heartbeat(self.node_id, self.regions())
                self.sent += 1
                if self.tick is not None:
                    self.tick()
            except Exception as exc:
                self.errors[str(exc)[:160]] += 1
            self._stop.wait(max(0.0, self.every - (time.monotonic() - started)))


# --- the benchmark ------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: Cluster, workdir: Path) -> None:
        self.args = args
        self.cluster = cluster
        self.workdir = workdir
        self.checkout = Path(args.checkout).resolve()
        self.kafka = Kafka(cluster.kafka_bootstrap)
        pythonpath = [str(self.checkout), os.environ.get("PYTHONPATH", "")]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}

    @contextlib.contextmanager
    def daemon(self, label: str, num_topics: int) -> Iterator[Daemon]:
        daemon = Daemon(self, label, num_topics)
        try:
            started = time.monotonic()
            daemon.start()
            log(
                f"daemon {daemon.prefix} leading after {time.monotonic() - started:.1f}s "
                f"(pid {daemon.pid})"
            )
            yield daemon
        finally:
            daemon.stop()
            self.heal()
            daemon.cleanup()

    def heal(self) -> None:
        try:
            self.cluster.heal()
        except Exception as exc:
            log(f"heal failed: {exc}")

    def broker_name(self, node_id: int) -> str:
        return self.cluster.broker_of(node_id)

    # --- 1 ---------------------------------------------------------------------------

    def follower_paused(self, run: int) -> dict[str, Any]:
        with self.daemon("fp", 1) as d:
            topic = d.topics[0]
            idle, busy = 1001, 1002
            d.api.register(idle, 1, topic)
            d.api.register(busy, 1, topic)
            last = self.kafka.produce(topic, 200)
            if last != 199:
                raise RuntimeError(f"expected offsets 0..199 in a new topic, got last {last}")
            d.api.heartbeat(1, [region(idle, topic, 10, latest=199), region(busy, topic, 149)])
            leader, replicas, _ = self.kafka.partition(topic)
            follower = next(n for n in replicas if n != leader)
            name = self.broker_name(follower)
            before = d.api.replay_start(idle)
            log(f"run {run}: leader {leader}, pausing follower {name}; replay-start {before}")
            samples: list[tuple[float, int | None, int]] = []
            view: dict[str, Any] = {}
            completed: float | None = None
            self.cluster.pause(name)
            try:
                t0 = time.monotonic()
                ids = d.api.purge(topic)
                while True:
                    now = time.monotonic() - t0
                    start = self.kafka.log_start(topic, timeout=1.0)
                    replay = d.api.replay_start(idle)
                    samples.append((round(now, 3), start, replay))
                    if completed is None:
                        view = d.api.procedure(ids[0])
                        if view["state"] in TERMINAL:
                            completed = time.monotonic() - t0
                    if completed is not None and now > completed + 1.0:
                        break
                    if now > self.args.follower_cap:
                        break
                    time.sleep(0.05)
            finally:
                self.cluster.resume(name)
            final = None
            deadline = time.monotonic() + 30
            while final is None and time.monotonic() < deadline:
                final = self.kafka.log_start(topic)
            below = 0.0
            max_gap = 0
            first_below = None
            for (t, start, replay), (t_next, _, _) in itertools.pairwise(samples):
                if start is not None and replay < start:
                    below += t_next - t
                    max_gap = max(max_gap, start - replay)
                    first_below = t if first_below is None else first_below
            unread = sum(1 for _, start, _ in samples if start is None)
            return {
                "paused_broker": name,
                "partition_leader": leader,
                "procedure_state": view.get("state"),
                "procedure_outcome": view.get("outcome"),
                "procedure_error": view.get("error"),
                "procedure_timings": view.get("timings"),
                "purge_completion_s": None if completed is None else round(completed, 3),
                "replay_start_below_log_start_s": round(below, 3),
                "max_gap_entries": max_gap,
                "first_below_at_s": first_below,
                "samples": len(samples),
                "samples_log_start_unread": unread,
                "replay_start_before": before,
                "replay_start_after": samples[-1][2] if samples else None,
                "final_log_start": final,
                "final_log_start_ok": final == 149,
            }

    # --- 2 ---------------------------------------------------------------------------

    def leader_killed(self, run: int) -> dict[str, Any]:
        cap = self.args.leader_cap
        with self.daemon("lk", 1) as d:
            topic = d.topics[0]
            idle, busy = 2001, 2002
            d.api.register(idle, 1, topic)
            d.api.register(busy, 1, topic)
            latest = self.kafka.produce(topic, 100)
            d.api.heartbeat(
                1, [region(idle, topic, 5, latest=latest), region(busy, topic, latest - 10)]
            )
            warm = d.api.wait(d.api.purge(topic)[0])
            if warm["state"] != "succeeded":
                raise RuntimeError(f"warm-up purge {warm['state']}: {warm.get('outcome')}")
            leader, _, _ = self.kafka.partition(topic)
            name = self.broker_name(leader)
            at_kill = self.kafka.log_start(topic)
            log(f"run {run}: warm purge ok (log start {at_kill}); killing leader {name}")
            killed_at = time.monotonic()
            killed_wall = time.time()
            elected: dict[str, Any] = {}
            plans: list[dict[str, Any]] = []
            stop = threading.Event()

            def watch_leader() -> None:
                own = Kafka(self.cluster.kafka_bootstrap)
                while not stop.is_set():
                    with contextlib.suppress(Exception):
                        new, _, isr = own.partition(topic, timeout=2.0)
                        if new >= 0 and new != leader:
                            elected.update(at=time.monotonic() - killed_at, leader=new, isr=isr)
                            return
                    stop.wait(0.2)

            def watch_plan() -> None:
                while not stop.is_set():
                    asked = time.monotonic()
                    row: dict[str, Any] = {"t": round(asked - killed_at, 1)}
                    try:
                        plan = d.api.plan(topic)
                        row.update(
                            {
                                k: plan.get(k)
                                for k in (
                                    "prune_point",
                                    "log_start_offset",
                                    "high_watermark",
                                    "reclaimable_entries",
                                    "kafka_unavailable",
                                )
                            }
                        )
                        row["blocked_by"] = sorted(
                            {b["reason"] for b in plan.get("blocked_by", [])}
                        )
                    except Exception as exc:
                        row["error"] = str(exc)[:200]
                    row["took_s"] = round(time.monotonic() - asked, 2)
                    plans.append(row)
                    stop.wait(5.0)

            watchers = [threading.Thread(target=f, daemon=True) for f in (watch_leader, watch_plan)]
            outcomes: Counter[str] = Counter()
            first_seen: dict[str, float] = {}
            purges = produce_failures = 0
            success: dict[str, Any] = {}
            self.cluster.kill(name)
            try:
                for w in watchers:
                    w.start()
                pending: list[str] = []
                done: set[str] = set()
                while not success and time.monotonic() - killed_at < cap:
                    round_at = time.monotonic()
                    try:
                        latest = self.kafka.produce(topic, 50, timeout=15)
                    except Exception:
                        produce_failures += 1
                    try:
                        d.api.heartbeat(
                            1,
                            [
                                region(idle, topic, 5, latest=latest),
                                region(busy, topic, latest - 10),
                            ],
                        )
                        purges += 1
                        pending.extend(i for i in d.api.purge(topic) if i not in done)
                    except Exception as exc:
                        key = f"request error: {str(exc)[:160]}"
                        outcomes[key] += 1
                        first_seen.setdefault(key, round(time.monotonic() - killed_at, 1))
                    for pid in list(dict.fromkeys(pending)):
                        try:
                            view = d.api.procedure(pid)
                        except Exception:
                            continue
                        if view["state"] not in TERMINAL:
                            continue
                        pending.remove(pid)
                        done.add(pid)
                        text = view.get("outcome") or view.get("error") or ""
                        key = f"{view['state']}: {str(text)[:160]}"
                        outcomes[key] += 1
                        first_seen.setdefault(key, round(time.monotonic() - killed_at, 1))
                        if view["state"] == "succeeded" and "at" in elected:
                            start = None
                            for _ in range(5):
                                start = self.kafka.log_start(topic)
                                if start is not None:
                                    break
                            if start is not None and at_kill is not None and start > at_kill:
                                finished = view.get("finished_at")
                                success.update(
                                    at=time.monotonic() - killed_at,
                                    log_start=start,
                                    finished_at=(
                                        datetime.fromisoformat(finished).timestamp() - killed_wall
                                        if isinstance(finished, str)
                                        else None
                                    ),
                                )
                    time.sleep(max(0.0, 2.0 - (time.monotonic() - round_at)))
            finally:
                stop.set()
                for w in watchers:
                    if w.is_alive():
                        w.join(70)
                restart = time.monotonic()
                try:
                    self.cluster.start(name)
                    log(f"{name} restarted in {time.monotonic() - restart:.1f}s")
                except Exception as exc:
                    log(f"restart of {name} failed: {exc}")
            elected_at = elected.get("at")
            succeeded_at = success.get("at")
            return {
                "killed_broker": name,
                "log_start_at_kill": at_kill,
                "new_leader_elected_s": None if elected_at is None else round(elected_at, 2),
                "new_leader": elected.get("leader"),
                "first_success_after_election_s": (
                    None
                    if succeeded_at is None or elected_at is None
                    else round(succeeded_at - elected_at, 2)
                ),
                "first_success_finished_after_election_s": (
                    None
                    if success.get("finished_at") is None or elected_at is None
                    else round(success["finished_at"] - elected_at, 2)
                ),
                "first_success_after_kill_s": (
                    None if succeeded_at is None else round(succeeded_at, 2)
                ),
                "capped": succeeded_at is None,
                "cap_s": cap,
                "log_start_after": success.get("log_start"),
                "purges_submitted": purges,
                "produce_failures": produce_failures,
                "outcomes": dict(outcomes),
                "outcome_first_seen_s": first_seen,
                "plans": plans,
                "plan_max_s": max((p["took_s"] for p in plans), default=None),
            }

    # --- 3 ---------------------------------------------------------------------------

    def broker_down_cpu(self, run: int) -> dict[str, Any]:
        window = self.args.cpu_window
        with self.daemon("cpu", 10) as d:
            regions = [(3000 + n, topic) for n, topic in enumerate(d.topics)]
            for region_id, topic in regions:
                d.api.register(region_id, 1, topic)
            flushed = {topic: self.kafka.produce(topic, 20) for topic in d.topics}

            def report() -> list[dict[str, Any]]:
                return [region(r, t, flushed[t] - 5) for r, t in regions]

            with Heartbeater(d.api, 1, report, 3.0) as beats:
                # A purge of every topic before each window (as a ticker would run), so the
                # daemon's Kafka admin client exists, and meets the broker just killed.
                time.sleep(3.5)
                warm = self._purge_every_topic(d)
                time.sleep(self.args.settle)
                up = self._cpu_window(d, window)
                leaders = Counter(self.kafka.partition(t)[0] for t in d.topics)
                victim = self.broker_name(leaders.most_common(1)[0][0])
                log(f"run {run}: idle {up['cores']:.3f} cores; killing {victim}")
                # New flushed ids reach the daemon first, so the purges right after the kill
                # have records to delete on partitions whose leader just died.
                for topic in d.topics:
                    flushed[topic] = self.kafka.produce(topic, 20)
                time.sleep(3.5)
                self.cluster.kill(victim)
                try:
                    after_kill = self._purge_every_topic(d)
                    time.sleep(self.args.settle)
                    down = self._cpu_window(d, window)
                finally:
                    self.cluster.start(victim)
                log(f"run {run}: one broker down {down['cores']:.3f} cores")
                return {
                    "killed_broker": victim,
                    "idle_cores": up["cores"],
                    "down_cores": down["cores"],
                    "above_idle_cores": round(down["cores"] - up["cores"], 3),
                    "idle": up,
                    "down": down,
                    "purges_before_idle_window": warm,
                    "purges_before_down_window": after_kill,
                    "heartbeats": beats.sent,
                    "heartbeat_errors": dict(beats.errors),
                }

    def _purge_every_topic(self, d: Daemon) -> dict[str, int]:
        """`POST /v1/purge` of every topic; each procedure's end state (or `timeout`)."""
        states: Counter[str] = Counter()
        started = time.monotonic()
        for pid in d.api.purge_all():
            try:
                left = max(1.0, 60.0 - (time.monotonic() - started))
                states[d.api.wait(pid, timeout=left)["state"]] += 1
            except TimeoutError:
                states["timeout"] += 1
        return dict(states)

    def _cpu_window(self, d: Daemon, seconds: float) -> dict[str, Any]:
        threads0 = thread_cpu(d.pid)
        cpu0 = cpu_seconds(d.pid)
        log0 = d.log_path.stat().st_size
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(d.pid) - cpu0
        threads1 = thread_cpu(d.pid)
        busiest = sorted(
            ((name, (v - threads0.get(name, 0.0)) / elapsed) for name, v in threads1.items()),
            key=lambda kv: -kv[1],
        )[:6]
        return {
            "seconds": round(elapsed, 1),
            "cores": round(cpu / elapsed, 4),
            "busiest_threads": {name: round(c, 3) for name, c in busiest},
            "rdkafka_threads": sum(1 for name in threads1 if name.startswith("rdk:")),
            "log_bytes": d.log_path.stat().st_size - log0,
            "loadavg": os.getloadavg()[0],
        }

    # --- 4 ---------------------------------------------------------------------------

    def produce_while_purging(self, run: int) -> dict[str, Any]:
        with self.daemon("pp", 1) as d:
            topic = d.topics[0]
            rid = 4001
            d.api.register(rid, 1, topic)
            state = {"latest": self.kafka.produce(topic, 2000, size=1024)}
            order = ["idle", "purging", "deleting"]
            phases = order[run % 3 :] + order[: run % 3]
            result: dict[str, Any] = {"order": phases}
            for phase in phases:
                result[phase] = self._produce_phase(d, topic, rid, state, phase)
                log(
                    f"run {run}: {phase}: {result[phase]['records_per_s']:.0f} records/s, "
                    f"daemon {result[phase]['daemon_cores']:.2f} cores"
                )
            idle_rate = result["idle"]["records_per_s"]
            for phase in ("purging", "deleting"):
                result[f"{phase}_ratio"] = (
                    round(result[phase]["records_per_s"] / idle_rate, 4) if idle_rate else None
                )
            return result

    def _produce_phase(
        self, d: Daemon, topic: str, rid: int, state: dict[str, int], phase: str
    ) -> dict[str, Any]:
        ids: set[str] = set()
        purge_errors: Counter[str] = Counter()

        def report() -> list[dict[str, Any]]:
            return [region(rid, topic, max(-1, state["latest"] - 1000))]

        def purge() -> None:
            try:
                if phase == "purging":
                    ids.update(d.api.purge(topic))
                elif phase == "deleting":
                    self.kafka.delete_below(topic, max(0, state["latest"] - 1000))
            except Exception as exc:
                purge_errors[str(exc)[:160]] += 1

        start_before = self.kafka.log_start(topic)
        producer = self.kafka.producer(**{"linger.ms": 5, "queue.buffering.max.messages": 50000})
        acked = failed = 0

        def done(err: Any, msg: Message) -> None:
            nonlocal acked, failed
            if err is not None:
                failed += 1
            else:
                acked += 1
                state["latest"] = max(state["latest"], int(msg.offset() or 0))

        payload = b"x" * 1024
        cpu0 = cpu_seconds(d.pid)
        with Heartbeater(d.api, 1, report, 0.1, tick=purge) as beats:
            seconds = self.args.produce_seconds
            elapsed = produce_for(producer, [topic], seconds, lambda _: payload, done, 60.0)
        daemon_cores = (cpu_seconds(d.pid) - cpu0) / elapsed
        start_after = self.kafka.log_start(topic)
        states: Counter[str] = Counter()
        for pid in sorted(ids)[-50:]:
            with contextlib.suppress(Exception):
                states[d.api.procedure(pid)["state"]] += 1
        return {
            "records_per_s": round(acked / elapsed, 1),
            "daemon_cores": round(daemon_cores, 3),
            "acked": acked,
            "failed": failed,
            "seconds": round(elapsed, 2),
            "heartbeats": beats.sent,
            "heartbeat_errors": dict(beats.errors),
            "purge_procedures": len(ids),
            "purge_errors": dict(purge_errors),
            "last_50_procedure_states": dict(states),
            "log_start_before": start_before,
            "log_start_after": start_after,
            "loadavg": os.getloadavg()[0],
        }


# --- report -------------------------------------------------------------------------------

SUMMARY: Figures = {
    "follower-paused": [
        ("purge_completion_s", "purge completion with one follower paused (s)"),
        ("replay_start_below_log_start_s", "time replay-start < log start (s)"),
        ("max_gap_entries", "largest gap below the log start (entries)"),
    ],
    "leader-killed": [
        ("new_leader_elected_s", "kill -> Kafka elects a new leader (s)"),
        ("first_success_after_election_s", "new leader -> first successful purge (s)"),
        ("plan_max_s", "slowest GET /v1/purge/plan meanwhile (s)"),
    ],
    "broker-down-cpu": [
        ("idle_cores", "daemon CPU, all brokers up (cores)"),
        ("down_cores", "daemon CPU, one broker down (cores)"),
        ("above_idle_cores", "CPU above idle (cores)"),
    ],
    "produce-while-purging": [
        ("idle.records_per_s", "producer, not purging (records/s)"),
        ("purging.records_per_s", "producer, metasrv purging every 100 ms (records/s)"),
        ("deleting.records_per_s", "producer, bare DeleteRecords every 100 ms (records/s)"),
        ("purging_ratio", "metasrv purging / not purging"),
        ("deleting_ratio", "bare DeleteRecords / not purging"),
        ("idle.daemon_cores", "daemon CPU, not purging (cores)"),
        ("purging.daemon_cores", "daemon CPU, purging every 100 ms (cores)"),
    ],
}


def print_report(result: dict[str, Any]) -> None:
    print(
        f"\nreplicated WAL, checkout {result['commit']}{' (dirty)' if result['dirty'] else ''}"
        f" at {result['checkout']}, {result['host']['nproc']} cores"
    )
    print_table(result["scenarios"], SUMMARY)


def git(checkout: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--checkout",
        default=str(product_tree()),
        help="repository whose code the daemon runs (default: the one this script imports)",
    )
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--leader-cap",
        type=float,
        default=330.0,
        help="leader-killed: give up this many seconds after the kill",
    )
    parser.add_argument(
        "--follower-cap",
        type=float,
        default=60.0,
        help="follower-paused: longest the follower stays paused",
    )
    parser.add_argument("--cpu-window", type=float, default=30.0)
    parser.add_argument(
        "--settle", type=float, default=5.0, help="broker-down-cpu: seconds before each CPU window"
    )
    parser.add_argument("--produce-seconds", type=float, default=20.0)
    parser.add_argument("--no-json", action="store_true", help="table only")
    args = parser.parse_args(argv)

    from toolbox.stack import cluster_up

    checkout = Path(args.checkout).resolve()
    if not (checkout / "cli" / "__init__.py").exists():
        parser.error(f"{checkout} is not a metasrv checkout")
    log("cluster: bringing up / checking the 3-broker cluster ...")
    cluster = cluster_up()
    short = git(checkout, "rev-parse", "--short", "HEAD")
    result: dict[str, Any] = {
        "benchmark": "replicated_wal",
        "checkout": str(checkout),
        "commit": short,
        "commit_full": git(checkout, "rev-parse", "HEAD"),
        "dirty": bool(git(checkout, "status", "--porcelain", "--untracked-files=no")),
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": host(),
        "cluster": {"kafka": cluster.kafka_bootstrap, "etcd": cluster.etcd_endpoints},
        "args": vars(args),
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="replicated-wal-") as tmp:
        bench = Bench(args, cluster, Path(tmp))
        probe = subprocess.run(
            [sys.executable, "-c", "import cli, metasrv; print(cli.__file__, metasrv.__file__)"],
            cwd=checkout,
            env=bench.env,
            capture_output=True,
            text=True,
            check=False,
        )
        result["daemon_modules"] = probe.stdout.strip()
        log(f"daemon code: {result['daemon_modules']}")
        runners: dict[str, Callable[[int], dict[str, Any]]] = {
            "follower-paused": bench.follower_paused,
            "leader-killed": bench.leader_killed,
            "broker-down-cpu": bench.broker_down_cpu,
            "produce-while-purging": bench.produce_while_purging,
        }
        try:
            result["scenarios"] = run_scenarios(
                args.scenario, args.runs, runners, SUMMARY, after_run=bench.heal
            )
        finally:
            bench.heal()
    print_report(result)
    save_run(result, f"replicated-wal-{short}", write=not args.no_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
