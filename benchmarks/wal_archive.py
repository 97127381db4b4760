"""Issue 36's WAL archive figures, black-box, on the 3-broker RF 3 cluster and the stack's S3
server (S3Proxy).

Every archiver is a `metasrv archive -c FILE` child, read from outside: its `/readyz` and
`/metrics`, its CPU from /proc, the group's committed offsets through the benchmark's own
Kafka client. A scenario that needs metasrv runs a `metasrv start -c FILE` child (etcd kv on
every cluster member, `[wal.archive]` enabled, so its group is pinned). Records are 1 KiB of
random bytes (incompressible: the archive's worst case for bytes), produced with acks=all to
partition 0 of topics created at replication factor 3. Objects close at `--object-max-bytes`
(default 8MB) or after `--object-max-delay` (default 5s), as `[wal.archive]` says.

    .venv/bin/python benchmarks/wal_archive.py                       # every scenario
    .venv/bin/python benchmarks/wal_archive.py --scenario lag --duration 60
    .venv/bin/python benchmarks/compare.py --base COMMIT -- \
        benchmarks/wal_archive.py --scenario restore

Scenarios (`--scenario`, default all):

- `throughput`: `--records` records spread over `--topics` topics, then one archiver drains
  them. Figures: records/s and MB/s (1 KiB payloads) from the moment the group has assigned
  it the topics until 90% of the records are committed (a drain's last objects are partial
  and wait object_max_delay to close; the whole drain is in the JSON), and per core (the
  archiver's CPU from /proc over the same window); the group's committed offsets are read
  every `--sample` s.
- `lag`: one archiver running; the benchmark's producer at its max rate for `--duration` s
  over `--topics` topics. Every `--sample` s: each topic's oldest record not yet committed by
  the group, and its age (now - the time its produce was acknowledged); the archive lag of a
  sample is the largest age over the topics (0 when every acknowledged record is committed).
  Figures over the steady part (after `--warmup` s, default 2 x object_max_delay, until the
  producer stops): median and max lag; whether it is steady (the last third's median at most
  1.5 x the first third's + 1 s: not growing), and whether the max is within the target,
  object_max_delay + 5 s. Then the drain: the producer stopped, until all is committed.
- `scale`: the same pre-filled topics drained by one archiver, then by two in another group.
  Figure: records/s of two / of one, each measured from the moment the group's assignment
  covers every topic (for two: split between both, as the cooperative-sticky assignor does)
  over the records not yet committed then.
- `producer`: producer throughput (max rate, `--duration` s, one topic) with an archiver
  running and a metasrv purging at `--purge-interval` (default: the product's
  `auto_prune_interval`, 30 min; the daemon is restarted once its region is mapped, so the
  new term's first round purges on the phase's first heartbeat, and a region heartbeats
  every 3 s with its flushed id 1,000 entries behind) vs neither running. The archiver
  catches up before its phase starts. Figure: the ratio (target >= 0.95x); the archiver's
  and the daemon's CPU in that phase, and the purges completed in it.
- `restore`: `--records` entries archived by an archiver; a region that never flushed
  replays them with the datanode's `replay_region` from Kafka, then (the topic trimmed past
  them with DeleteRecords, as retention would) from the archive's objects replay-start names.
  Figure: entries/s each (replay-start's answer included), in this process.

Each scenario has its own topics, consumer groups, bucket prefix and etcd key prefix, removed
with its processes afterwards. A table and `label: number` lines (`compare.py` reads them) go
to stdout; JSON to benchmarks/results/wal-archive-<sha>-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from _daemon import daemon_sections, remove_keys, wal_section
from _metrics import scrape
from _proc import cpu_seconds
from _produce import produce_for
from _results import (
    Figures,
    commit_of,
    host,
    log,
    median,
    print_table,
    product_tree,
    run_scenarios,
    save_run,
)
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from metasrv.settings import ArchiveSettings, WalSettings
from toolbox.simulator import (
    ArchiverProcess,
    MetasrvProcess,
    free_port,
    migrate,
    render_config,
)

if TYPE_CHECKING:
    from toolbox.stack import Cluster, S3Endpoint

SCENARIOS = ("throughput", "lag", "scale", "producer", "restore")
RECORD_BYTES = 1024
DRAINED = 0.9
"""Share of a drain's records the rate is measured over (`Bench.drain`)."""
MB = 1_000_000
_POOL = os.urandom(4 << 20)
"""Random bytes the payloads are cut from: a period longer than zstd's window, so objects
do not compress."""


def payload(n: int) -> bytes:
    start = (n * RECORD_BYTES) % (len(_POOL) - RECORD_BYTES)
    return _POOL[start : start + RECORD_BYTES]


def rnd(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# --- Kafka, from outside ----------------------------------------------------------------


class Kafka:
    """The benchmark's own Kafka clients (never an archiver's or the daemon's)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})
        self._readers: dict[str, Consumer] = {}

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def _reader(self, group: str) -> Consumer:
        """A consumer of `group` that never subscribes: it only reads committed offsets and
        watermarks, so it never joins the group."""
        if group not in self._readers:
            self._readers[group] = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": group,
                    "enable.auto.commit": False,
                }
            )
        return self._readers[group]

    def create_topics(self, topics: list[str]) -> None:
        futures = self.admin.create_topics(
            [NewTopic(t, num_partitions=1, replication_factor=3) for t in topics],
            operation_timeout=30,
        )
        for future in futures.values():
            future.result(60)
        for topic in topics:  # the partition's leader known before anyone produces
            deadline = time.monotonic() + 30
            while self._leader(topic) < 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{topic}: no partition leader after 30s")
                time.sleep(0.2)

    def _leader(self, topic: str) -> int:
        """Partition 0's leader, -1 while the metadata names none (or not the topic yet)."""
        meta = self.admin.list_topics(topic, timeout=5).topics.get(topic)
        part = None if meta is None else meta.partitions.get(0)
        return -1 if part is None else int(part.leader)

    def delete_topics(self, topics: list[str]) -> None:
        if not topics:
            return
        for topic, future in self.admin.delete_topics(topics, operation_timeout=30).items():
            try:
                future.result(60)
            except KafkaException as exc:
                log(f"cleanup: topic {topic}: {exc}")

    def delete_groups(self, groups: list[str]) -> None:
        for group in groups:
            reader = self._readers.pop(group, None)
            if reader is not None:
                reader.close()
            try:
                self.admin.delete_consumer_groups([group], request_timeout=30)[group].result(60)
            except KafkaException as exc:
                if "GROUP_ID_NOT_FOUND" not in str(exc):
                    log(f"cleanup: group {group}: {exc}")

    def producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "queue.buffering.max.messages": 50000,
            }
        )

    def fill(self, topics: list[str], count: int) -> dict[str, int]:
        """`count` records (1 KiB, acks=all) spread round-robin over `topics`; each topic's
        high watermark after. Raises if any is not delivered."""
        producer = self.producer()
        failed: list[str] = []

        def done(err: Any, _msg: Message) -> None:
            if err is not None:
                failed.append(str(err))

        for n in range(count):
            topic = topics[n % len(topics)]
            while True:
                try:
                    producer.produce(topic, value=payload(n), partition=0, on_delivery=done)
                    break
                except BufferError:
                    producer.poll(0.05)
            if n % 1000 == 0:
                producer.poll(0)
        if producer.flush(120) != 0 or failed:
            raise RuntimeError(f"records not delivered: {failed[:3]}")
        return self.high(topics)

    def high(self, topics: list[str]) -> dict[str, int]:
        """Each topic's partition-0 high watermark, read from the broker."""
        reader = self._reader("wal-archive-bench-watermarks")
        return {
            t: int(reader.get_watermark_offsets(TopicPartition(t, 0), timeout=10, cached=False)[1])
            for t in topics
        }

    def committed(self, group: str, topics: list[str]) -> dict[str, int]:
        """The group's committed offset of each topic's partition 0 (0 when none yet)."""
        answer = self._reader(group).committed([TopicPartition(t, 0) for t in topics], timeout=10)
        return {tp.topic: max(0, tp.offset) for tp in answer}

    def trim(self, topic: str, offset: int) -> int:
        """DeleteRecords below `offset` (as retention or an operator would); the new log start."""
        part = TopicPartition(topic, 0, offset)
        deleted = self.admin.delete_records([part], operation_timeout=30)[part].result(60)
        return int(deleted.low_watermark)


# --- processes ------------------------------------------------------------------------------


class Archiver(ArchiverProcess):
    """One `metasrv archive -c FILE` child, its config and log in the benchmark's workdir."""

    def __init__(
        self, bench: Bench, name: str, wal: dict[str, Any], archive: dict[str, Any]
    ) -> None:
        url = f"http://127.0.0.1:{free_port()}"
        config = bench.workdir / f"{name}.toml"
        http = {"addr": url.removeprefix("http://")}
        config.write_text(render_config({"wal": wal, "wal.archive": archive, "http": http}))
        super().__init__(
            config,
            bench.workdir / f"{name}.log",
            url,
            args=("--log-level", "warning"),
            env=bench.env,
            cwd=bench.checkout,
        )
        self.name = name

    def metrics(self) -> dict[str, float]:
        with contextlib.suppress(httpx.HTTPError):
            return scrape(self.url)
        return {}

    def cpu(self) -> float:
        return cpu_seconds(self.pid)


class Daemon:
    """One `metasrv start -c FILE` child: etcd kv on the cluster, the archive enabled."""

    def __init__(
        self, bench: Bench, prefix: str, wal: dict[str, Any], archive: dict[str, Any]
    ) -> None:
        self.bench = bench
        self.prefix = prefix
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.config = bench.workdir / f"{prefix}-metasrv.toml"
        self.log_path = bench.workdir / f"{prefix}-metasrv.log"
        cluster, addr = bench.cluster, f"127.0.0.1:{port}"
        sections = daemon_sections(cluster, bench.workdir, prefix, addr, wal)
        self.config.write_text(render_config({**sections, "wal.archive": archive}))
        self.process = MetasrvProcess(
            self.config, self.log_path, self.url, env=bench.env, cwd=bench.checkout
        )
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self) -> None:
        migrate(self.config, self.bench.workdir / f"{self.prefix}-migrate.log")
        self.process.start(120.0)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.http.post(path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:300]}")
        return response.json()

    def register(self, region_id: int, topic: str) -> None:
        self.post("/v1/regions", {"region_id": region_id, "node_id": 1, "topic": topic})

    def heartbeat(self, region_id: int, topic: str, flushed: int) -> None:
        report = {
            "region_id": region_id,
            "topic": topic,
            "flushed_entry_id": flushed,
            "topic_latest_entry_id": None,
            "memtable_bytes": 1 << 20,
            "manifest_version": 1,
        }
        body = {"node_id": 1, "addr": None, "regions": [report], "topics": []}
        answer = self.post("/v1/heartbeat", body)
        if answer.get("rejected"):
            raise RuntimeError(f"heartbeat rejected: {answer['rejected']}")

    def restart(self) -> None:
        """Stop and start it: a new term, whose first purge round runs once every mapped
        region has reported (not one `auto_prune_interval` later)."""
        self.process.stop(20)
        self.process.start(120.0)

    def stop(self) -> None:
        self.http.close()
        self.process.stop(20)

    def remove_keys(self) -> None:
        """Delete the daemon's etcd keys (everything under its key prefix)."""
        remove_keys(self.bench.cluster, self.prefix)


# --- the benchmark ------------------------------------------------------------------------


class Scope:
    """What one scenario run creates (topics, groups, processes, a bucket prefix), removed
    by `Bench.scope` however the run ends."""

    def __init__(self, bench: Bench, label: str) -> None:
        self.bench = bench
        self.prefix = f"warc{uuid.uuid4().hex[:8]}_{label}"
        self.topics: list[str] = []
        self.groups: list[str] = []
        self.archivers: list[Archiver] = []
        self.daemons: list[Daemon] = []

    def wal(self, num_topics: int) -> dict[str, Any]:
        """The `[wal]` table of this scope's topic pool (`{prefix}_{n}`)."""
        return wal_section(self.bench.cluster, self.prefix, num_topics)

    def make_topics(self, count: int) -> list[str]:
        topics = [f"{self.prefix}_{n}" for n in range(count)]
        self.topics.extend(topics)
        self.bench.kafka.create_topics(topics)
        return topics

    def archive(self, group: str) -> dict[str, Any]:
        """The `[wal.archive]` table: `group`, objects under this scope's bucket prefix."""
        return self.bench.archive_config(group, f"{self.prefix}/")

    def group(self, label: str) -> str:
        name = f"{self.prefix}-{label}"
        self.groups.append(name)
        return name

    def archiver(self, label: str, num_topics: int, group: str) -> Archiver:
        archiver = Archiver(
            self.bench, f"{self.prefix}-{label}", self.wal(num_topics), self.archive(group)
        )
        self.archivers.append(archiver)
        archiver.spawn()  # not waited for: `Bench.drain` times the wait for an assignment
        return archiver

    def daemon(self, num_topics: int, group: str, **wal: Any) -> Daemon:
        daemon = Daemon(
            self.bench, self.prefix, {**self.wal(num_topics), **wal}, self.archive(group)
        )
        self.daemons.append(daemon)
        started = time.monotonic()
        daemon.start()
        log(f"metasrv {daemon.url} leading after {time.monotonic() - started:.1f}s")
        return daemon

    def close(self) -> None:
        for archiver in self.archivers:
            code = archiver.stop(30)
            if code not in (0, None):
                log(f"{archiver.name} exited with {code}:\n{archiver.tail()}")
        for daemon in self.daemons:
            daemon.stop()
            daemon.remove_keys()
        kafka = self.bench.kafka
        kafka.delete_groups(self.groups)
        kafka.delete_topics(self.topics)
        removed = self.bench.remove_objects(f"{self.prefix}/")
        log(f"cleanup: {len(self.topics)} topics, {len(self.groups)} groups, {removed} objects")


class Bench:
    def __init__(
        self, args: argparse.Namespace, cluster: Cluster, s3: S3Endpoint, workdir: Path
    ) -> None:
        from metasrv.archive import ObjectStore

        self.args = args
        self.cluster = cluster
        self.s3 = s3
        self.workdir = workdir
        self.checkout = product_tree()
        self.kafka = Kafka(cluster.kafka_bootstrap)
        # The whole bucket: restores read, and cleanups delete, under any scenario's prefix.
        self.store = ObjectStore(ArchiveSettings.model_validate(self.archive_config("", "")))
        pythonpath = [str(self.checkout), os.environ.get("PYTHONPATH", "")]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}

    def archive_config(self, group: str, prefix: str) -> dict[str, Any]:
        """`[wal.archive]` on the stack's S3 server: `group` (empty: the default), objects
        under `prefix`, closed at the benchmark's size and delay."""
        return {
            "enabled": True,
            "endpoint": self.s3.endpoint,
            "bucket": self.s3.bucket,
            "prefix": prefix,
            "access_key_id": self.s3.access_key_id,
            "secret_access_key": self.s3.secret_access_key,
            **({"consumer_group": group} if group else {}),
            "object_max_bytes": self.args.object_max_bytes,
            "object_max_delay": f"{self.args.object_max_delay:g}s",
        }

    def remove_objects(self, prefix: str) -> int:
        objects = self.store.list(prefix)
        for obj in objects:
            self.store.delete(obj.key)
        return len(objects)

    @contextlib.contextmanager
    def scope(self, label: str) -> Iterator[Scope]:
        scope = Scope(self, label)
        try:
            yield scope
        finally:
            try:
                scope.close()
            except Exception as exc:
                log(f"cleanup of {scope.prefix} failed: {exc!r}")

    def wait_assigned(
        self, archivers: list[Archiver], topics: list[str], timeout: float = 120.0
    ) -> float:
        """Wait until every archiver is ready and their assignments split `topics` between
        them (each holds some, none twice, all held); the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while True:
            held = [sorted(a.assigned() or ()) for a in archivers]
            flat = [t for h in held for t in h]
            if all(held) and sorted(flat) == sorted(topics):
                return time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError(f"assignment not split after {timeout:.0f}s: {held}")
            time.sleep(0.1)

    def drain(
        self, archivers: list[Archiver], group: str, topics: list[str], high: dict[str, int]
    ) -> dict[str, Any]:
        """Wait until the group's assignment covers `topics`, then until it has committed
        every record below `high`. The rate and CPU are taken from that moment until
        `DRAINED` of the records left then are committed: a drain's last objects are smaller
        than `object_max_bytes` and wait `object_max_delay` to close (the whole drain's
        figures are beside them)."""
        total = sum(high.values())
        t0 = self.wait_assigned(archivers, topics)
        cpu0 = sum(a.cpu() for a in archivers)
        before = sum(self.kafka.committed(group, topics).values())
        left = total - before
        samples: list[tuple[float, int, float]] = []
        deadline = t0 + self.args.drain_cap
        while True:
            committed = self.kafka.committed(group, topics)
            now = time.monotonic()
            done = sum(min(committed[t], high[t]) for t in topics)
            cpu = sum(a.cpu() for a in archivers) - cpu0
            samples.append((round(now - t0, 3), done - before, round(cpu, 3)))
            if done >= total:
                break
            if now > deadline:
                raise RuntimeError(f"{done} of {total} committed after {self.args.drain_cap:g}s")
            for a in archivers:
                a.readyz()  # raises if one exited
            time.sleep(self.args.sample)
        elapsed = now - t0
        t, records, cpu = next(x for x in samples if x[1] >= DRAINED * left)
        rate = records / t if t > 0 else None
        metrics = [a.metrics() for a in archivers]
        written = sum(m.get("metasrv_archiver_written_bytes_total", 0.0) for m in metrics)
        objects = sum(m.get("metasrv_archiver_written_objects_total", 0.0) for m in metrics)
        return {
            "records": total,
            "records_left_at_assignment": left,
            "window_s": t,
            "window_records": records,
            "records_per_s": rnd(rate, 1),
            "mb_per_s": rnd(None if rate is None else rate * RECORD_BYTES / MB),
            "archiver_cores": round(cpu / t, 3) if t > 0 else None,
            "records_per_cpu_s": round(records / cpu, 1) if cpu > 0 else None,
            "mb_per_cpu_s": round(records * RECORD_BYTES / MB / cpu, 3) if cpu > 0 else None,
            "whole_drain_s": round(elapsed, 2),
            "whole_drain_records_per_s": round(left / elapsed, 1) if elapsed > 0 else None,
            "whole_drain_cpu_s": samples[-1][2],
            "object_bytes_written": int(written),
            "objects_written": int(objects),
            "samples": samples,
        }

    # --- throughput ---------------------------------------------------------------------

    def throughput(self, run: int) -> dict[str, Any]:
        with self.scope("tp") as s:
            topics = s.make_topics(self.args.topics)
            high = self._fill(topics)
            group = s.group("archive")
            started = time.monotonic()
            archiver = s.archiver("archiver", len(topics), group)
            result = self.drain([archiver], group, topics, high)
            result["start_to_done_s"] = round(time.monotonic() - started, 2)
            log(
                f"run {run}: one archiver {result['records_per_s']} records/s, "
                f"{result['archiver_cores']} cores"
            )
            return result

    def _fill(self, topics: list[str]) -> dict[str, int]:
        t0 = time.monotonic()
        high = self.kafka.fill(topics, self.args.records)
        took = time.monotonic() - t0
        log(f"{sum(high.values())} records in {len(topics)} topics in {took:.1f}s")
        return high

    # --- lag ----------------------------------------------------------------------------

    def lag(self, run: int) -> dict[str, Any]:
        args = self.args
        with self.scope("lag") as s:
            topics = s.make_topics(args.topics)
            group = s.group("archive")
            archiver = s.archiver("archiver", len(topics), group)
            self.wait_assigned([archiver], topics)
            acked: dict[str, tuple[list[int], list[float]]] = {t: ([], []) for t in topics}
            samples: list[dict[str, Any]] = []
            stop = threading.Event()
            lock = threading.Lock()

            def done(err: Any, msg: Message) -> None:
                if err is None:
                    offsets, at = acked[msg.topic() or ""]
                    with lock:
                        offsets.append(int(msg.offset() or 0))
                        at.append(time.monotonic())

            t0 = time.monotonic()
            cpu0 = archiver.cpu()

            def sample() -> None:
                reader = Kafka(self.cluster.kafka_bootstrap)
                try:
                    while not stop.is_set():
                        committed = reader.committed(group, topics)
                        now = time.monotonic()
                        ages: list[float] = []
                        behind = 0
                        with lock:
                            for topic in topics:
                                offsets, at = acked[topic]
                                i = bisect.bisect_left(offsets, committed[topic])
                                behind += len(offsets) - i
                                ages.append(now - at[i] if i < len(offsets) else 0.0)
                        samples.append(
                            {
                                "t": round(now - t0, 2),
                                "lag_s": round(max(ages), 3),
                                "behind": behind,
                            }
                        )
                        stop.wait(args.sample)
                finally:
                    reader.close()

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                produced, failed, seconds = self._produce_for(topics, args.duration, done)
                end = time.monotonic() - t0
                # The drain: until the group has committed every acknowledged record.
                high = self.kafka.high(topics)
                deadline = time.monotonic() + args.object_max_delay + 60
                while not (
                    caught_up := sum(self.kafka.committed(group, topics).values())
                    >= sum(high.values())
                ):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(args.sample)
                drained = time.monotonic() - t0 - end
            finally:
                stop.set()
                sampler.join(30)
            cores = (archiver.cpu() - cpu0) / (time.monotonic() - t0)
            warmup = args.warmup if args.warmup is not None else 2 * args.object_max_delay
            warmup = min(warmup, end / 2)
            steady = [x["lag_s"] for x in samples if warmup <= x["t"] <= end]
            third = max(1, len(steady) // 3)
            first, last = median(steady[:third]), median(steady[-third:])
            target = args.object_max_delay + 5
            lag_max = max(steady) if steady else None
            trend_ok = first is not None and last is not None and last <= 1.5 * first + 1
            result = {
                "object_max_delay_s": args.object_max_delay,
                "target_s": target,
                "producer_records_per_s": round(produced / seconds, 1),
                "produced": produced,
                "produce_failures": failed,
                "warmup_s": round(warmup, 1),
                "steady_samples": len(steady),
                "lag_median_s": rnd(median(steady)),
                "lag_max_s": rnd(lag_max),
                "lag_first_third_median_s": rnd(first),
                "lag_last_third_median_s": rnd(last),
                "steady": int(trend_ok),
                "within_target": int(lag_max is not None and lag_max <= target),
                "drain_after_producer_s": round(drained, 2),
                "drained": caught_up,
                "archiver_cores": round(cores, 3),
                "samples": samples,
            }
            log(
                f"run {run}: producer {result['producer_records_per_s']} records/s; lag median "
                f"{result['lag_median_s']} s, max {result['lag_max_s']} s, steady {trend_ok}"
            )
            return result

    def _produce_for(
        self, topics: list[str], seconds: float, on_delivery: Callable[[Any, Message], None]
    ) -> tuple[int, int, float]:
        """Produce 1 KiB records round-robin over `topics` as fast as the producer takes them
        for `seconds`, then flush; (acknowledged, failed, seconds including the flush)."""
        counts = {"acked": 0, "failed": 0}

        def done(err: Any, msg: Message) -> None:
            counts["failed" if err is not None else "acked"] += 1
            on_delivery(err, msg)

        took = produce_for(self.kafka.producer(), topics, seconds, payload, done)
        return counts["acked"], counts["failed"], took

    # --- scale --------------------------------------------------------------------------

    def scale(self, run: int) -> dict[str, Any]:
        with self.scope("sc") as s:
            topics = s.make_topics(self.args.topics)
            high = self._fill(topics)
            result: dict[str, Any] = {}
            for count in (1, 2):
                group = s.group(f"archive{count}")
                archivers = [
                    s.archiver(f"archiver{count}-{n}", len(topics), group) for n in range(count)
                ]
                result[f"archivers_{count}"] = self.drain(archivers, group, topics, high)
                for archiver in archivers:
                    archiver.stop(30)
                rate = result[f"archivers_{count}"]["records_per_s"]
                log(f"run {run}: {count} archiver(s): {rate} records/s")
            one = result["archivers_1"]["records_per_s"]
            two = result["archivers_2"]["records_per_s"]
            result["ratio"] = round(two / one, 3) if one and two else None
            return result

    # --- producer -----------------------------------------------------------------------

    def producer(self, run: int) -> dict[str, Any]:
        args = self.args
        with self.scope("pr") as s:
            [topic] = s.make_topics(1)
            state = {"latest": max(self.kafka.fill([topic], 2000).values()) - 1}
            order = ["neither", "archiving"] if run % 2 == 0 else ["archiving", "neither"]
            result: dict[str, Any] = {"order": order, "purge_interval": args.purge_interval}
            group = s.group("archive")

            def acked(err: Any, msg: Message) -> None:
                if err is None:
                    state["latest"] = max(state["latest"], int(msg.offset() or 0))

            for phase in order:
                if phase == "neither":
                    n, failed, seconds = self._produce_for([topic], args.duration, acked)
                    result[phase] = {"records_per_s": round(n / seconds, 1), "failed": failed}
                else:
                    result[phase] = self._archiving_phase(s, topic, group, state, acked)
                log(f"run {run}: {phase}: {result[phase]['records_per_s']} records/s")
            base = result["neither"]["records_per_s"]
            result["ratio"] = (
                round(result["archiving"]["records_per_s"] / base, 4) if base else None
            )
            return result

    def _archiving_phase(
        self,
        s: Scope,
        topic: str,
        group: str,
        state: dict[str, int],
        acked: Callable[[Any, Message], None],
    ) -> dict[str, Any]:
        args = self.args
        daemon = s.daemon(1, group, auto_prune_interval=args.purge_interval)
        region = 5001
        daemon.register(region, topic)
        # The region mapped, a new term: its first purge round runs on the phase's first
        # heartbeat, so the measured window holds a purge even at a 30 min interval.
        daemon.restart()
        archiver = s.archiver("archiver", 1, group)
        self.wait_assigned([archiver], [topic])
        # Caught up first: the phase measures an archiver keeping pace, not draining a backlog.
        high = self.kafka.high([topic])[topic]
        deadline = time.monotonic() + args.drain_cap
        while self.kafka.committed(group, [topic])[topic] < high:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the archiver did not catch up to {high} in time")
            time.sleep(args.sample)
        stop = threading.Event()
        errors: list[str] = []

        def heartbeat() -> None:
            while not stop.is_set():
                try:
                    daemon.heartbeat(region, topic, max(-1, state["latest"] - 1000))
                except Exception as exc:
                    errors.append(str(exc)[:200])
                stop.wait(3.0)

        beats = threading.Thread(target=heartbeat, daemon=True)
        beats.start()
        metrics0 = scrape(daemon.url)
        cpu0, dcpu0 = archiver.cpu(), cpu_seconds(daemon.pid)
        log_start0 = self._log_start(topic)
        try:
            n, failed, seconds = self._produce_for([topic], args.duration, acked)
        finally:
            stop.set()
            beats.join(10)
        metrics1 = scrape(daemon.url)
        purge_deltas = {
            k: v - metrics0.get(k, 0.0)
            for k, v in metrics1.items()
            if k.startswith(("metasrv_wal_purge", "metasrv_wal_entries_deleted"))
            and not k.endswith("_created")
        }
        result = {
            "records_per_s": round(n / seconds, 1),
            "failed": failed,
            "archiver_cores": round((archiver.cpu() - cpu0) / seconds, 3),
            "daemon_cores": round((cpu_seconds(daemon.pid) - dcpu0) / seconds, 3),
            "log_start_before": log_start0,
            "log_start_after": self._log_start(topic),
            "purges": int(purge_deltas.get("metasrv_wal_purges_total", 0)),
            "daemon_purge_metric_deltas": purge_deltas,
            "heartbeat_errors": errors[:5],
        }
        archiver.stop(30)
        daemon.stop()
        return result

    def _log_start(self, topic: str) -> int | None:
        reader = self.kafka._reader("wal-archive-bench-watermarks")
        with contextlib.suppress(KafkaException):
            low, _ = reader.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=10, cached=False
            )
            return int(low)
        return None

    # --- restore ------------------------------------------------------------------------

    def restore(self, run: int) -> dict[str, Any]:
        from metasrv.datanode import DatanodeClient, replay_region

        with self.scope("rs") as s:
            [topic] = s.make_topics(1)
            high = self._fill([topic])
            group = s.group("archive")
            archiver = s.archiver("archiver", 1, group)
            self.drain([archiver], group, [topic], high)
            archiver.stop(30)
            daemon = s.daemon(1, group, auto_prune_interval="0s")
            region = 6001
            daemon.register(region, topic)
            wanted = high[topic]
            result: dict[str, Any] = {"entries": wanted}
            with DatanodeClient(daemon.url, timeout=30.0) as client:
                for source in ("kafka", "archive"):
                    if source == "archive":
                        log_start = self.kafka.trim(topic, wanted)
                        if log_start != wanted:
                            raise RuntimeError(f"trim left the log start at {log_start}")
                    t0 = time.monotonic()
                    count = 0
                    entries = replay_region(
                        client, region, kafka=self.kafka.bootstrap, store=self.store, timeout=600
                    )
                    for count, entry in enumerate(entries, 1):
                        if entry.entry_id != count - 1 or len(entry.value or b"") != RECORD_BYTES:
                            raise RuntimeError(f"{source}: entry {entry.entry_id} at {count - 1}")
                    seconds = time.monotonic() - t0
                    if count != wanted:
                        raise RuntimeError(f"{source}: {count} entries replayed, {wanted} expected")
                    result[source] = {
                        "seconds": round(seconds, 3),
                        "entries_per_s": round(count / seconds, 1),
                    }
                    log(f"run {run}: {count} entries from {source} in {seconds:.2f}s")
            result["objects"] = len(self.store.list(f"{s.prefix}/"))
            result["archive_over_kafka"] = round(
                result["archive"]["entries_per_s"] / result["kafka"]["entries_per_s"], 3
            )
            return result


# --- report -------------------------------------------------------------------------------

SUMMARY: Figures = {
    "throughput": [
        ("records_per_s", "one archiver records/s"),
        ("mb_per_s", "one archiver MB/s"),
        ("archiver_cores", "archiver CPU (cores)"),
        ("records_per_cpu_s", "records/s per core"),
        ("mb_per_cpu_s", "MB/s per core"),
    ],
    "lag": [
        ("producer_records_per_s", "producer records/s"),
        ("lag_median_s", "archive lag median (s)"),
        ("lag_max_s", "archive lag max (s)"),
        ("steady", "steady (1 yes)"),
        ("within_target", "max within target (1 yes)"),
        ("archiver_cores", "archiver CPU (cores)"),
    ],
    "scale": [
        ("archivers_1.records_per_s", "one archiver records/s"),
        ("archivers_2.records_per_s", "two archivers records/s"),
        ("ratio", "two / one"),
    ],
    "producer": [
        ("neither.records_per_s", "producer alone records/s"),
        ("archiving.records_per_s", "producer with archiver and purges records/s"),
        ("ratio", "with / alone"),
        ("archiving.archiver_cores", "archiver CPU (cores)"),
        ("archiving.daemon_cores", "metasrv CPU (cores)"),
        ("archiving.purges", "purges completed in the window"),
    ],
    "restore": [
        ("kafka.entries_per_s", "replay from Kafka entries/s"),
        ("archive.entries_per_s", "replay from the archive entries/s"),
        ("archive_over_kafka", "archive / Kafka"),
    ],
}


def print_report(result: dict[str, Any]) -> None:
    args = result["args"]
    print(
        f"\nWAL archive, commit {result['commit']}, {result['host']['nproc']} cores; "
        f"objects close at {args['object_max_bytes']} or after {args['object_max_delay']:g} s"
    )
    print_table(result["scenarios"], SUMMARY)
    lines: list[str] = []
    for name, data in result["scenarios"].items():
        for key, label in SUMMARY[name]:
            value = data["summary"][key]["median"]
            if value is not None:
                lines.append(
                    f"{name} {label}: {value:.0f}"
                    if abs(value) >= 100
                    else f"{name} {label}: {value:.4g}"
                )
    print()
    for line in lines:
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--records",
        type=int,
        default=200_000,
        help="throughput, scale, restore: records pre-filled (1 KiB each)",
    )
    parser.add_argument(
        "--topics", type=int, default=8, help="throughput, lag, scale: WAL topics (RF 3)"
    )
    parser.add_argument(
        "--duration", type=float, default=45.0, help="lag, producer: seconds of producing"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="lag: seconds before the steady part (default 2 x object_max_delay)",
    )
    parser.add_argument("--object-max-delay", type=float, default=5.0, help="seconds")
    parser.add_argument("--object-max-bytes", default="8MB")
    parser.add_argument(
        "--purge-interval",
        default=f"{WalSettings().auto_prune_interval:g}s",
        help="producer: the daemon's auto_prune_interval (default: the product's)",
    )
    parser.add_argument("--sample", type=float, default=0.25, help="seconds between samples")
    parser.add_argument(
        "--drain-cap", type=float, default=600.0, help="longest wait for an archiver to drain"
    )
    parser.add_argument("--no-json", action="store_true", help="table only")
    args = parser.parse_args(argv)
    if args.records < 1 or args.topics < 2 or args.duration <= 0:
        parser.error("--records >= 1, --topics >= 2 (scale needs a split), --duration > 0")

    from toolbox.stack import StackConfig, cluster_up, s3_endpoint_of, start_service

    cfg = StackConfig.from_env()
    log("cluster: bringing up / checking the 3-broker cluster and the S3 server ...")
    cluster = cluster_up(cfg)
    start_service(cfg, "s3")
    s3 = s3_endpoint_of(cfg)
    tree = product_tree()
    short = commit_of(tree)
    result: dict[str, Any] = {
        "benchmark": "wal_archive",
        "tree": str(tree),
        "commit": short,
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": host(),
        "cluster": {"kafka": cluster.kafka_bootstrap, "etcd": cluster.etcd_endpoints},
        "s3": {"endpoint": s3.endpoint, "bucket": s3.bucket},
        "args": vars(args),
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="wal-archive-") as tmp:
        bench = Bench(args, cluster, s3, Path(tmp))
        runners: dict[str, Callable[[int], dict[str, Any]]] = {
            "throughput": bench.throughput,
            "lag": bench.lag,
            "scale": bench.scale,
            "producer": bench.producer,
            "restore": bench.restore,
        }
        try:
            result["scenarios"] = run_scenarios(args.scenario, args.runs, runners, SUMMARY)
        finally:
            bench.kafka.close()
            bench.store.close()
    print_report(result)
    save_run(result, f"wal-archive-{short}", write=not args.no_json)
    failed = any("error" in r for data in result["scenarios"].values() for r in data["runs"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
