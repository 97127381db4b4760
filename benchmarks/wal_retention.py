"""WAL retained by metasrv's purge vs the minimum possible, vs Kafka time retention.

Runs a real `metasrv start` on the local stack's Kafka, the simulator's default workload
(`WorkloadConfig()`: 3 datanodes x 8 regions, 200 rows/s, a quarter of the regions flush
only when the metasrv asks, an eighth idle), and copies every WAL record to two twin topics
per WAL topic that metasrv never purges:

- `*.ret7d`: Kafka's default time retention (7 days): nothing is deleted during the run;
- `*.ret1m`: an aggressive 1-minute retention (`retention.ms=60000`, `segment.ms=5000`; the
  stack's broker checks retention every 5 s).

Every `--sample-interval` seconds it reads each topic's log start offset, then each
region's unflushed rows (the entries still needed: acknowledged, not yet in an SST), and
records per policy:
- bytes retained: record bytes in [log start, high watermark);
- minimum possible: record bytes in [lowest needed offset, high watermark);
- needed entries lost: needed rows below the log start (unique (region, seq)).

Target: retained / minimum <= 1.25 for metasrv's purge (mean over the second half of
the run), and 0 needed entries lost. At the end every datanode is crash-restarted and
every acknowledged row verified. Prints a table; writes JSON (`--out`).

Usage: `.venv/bin/python benchmarks/wal_retention.py [--duration 180] [--out FILE]`
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from rich.console import Console
from rich.table import Table

from metasrv.kafka import KafkaAdmin
from metasrv.wire import MetasrvClient
from toolbox.simulator import (
    MetasrvProcess,
    Workload,
    WorkloadConfig,
    free_port,
    migrate,
    render_config,
)
from toolbox.stack import ensure_up

logger = logging.getLogger("wal_retention")

NUM_TOPICS = 4
TWINS = {
    "ret7d": {"retention.ms": str(7 * 24 * 3600 * 1000)},
    "ret1m": {"retention.ms": "60000"},
}
TARGET_RATIO = 1.25
PURGE = "metasrv purge"
POLICY_OF_TWIN = {"ret7d": "Kafka retention 7 days", "ret1m": "Kafka retention 1 minute"}


class OffsetBytes:
    """Record sizes of one partition by offset (dense from 0), with prefix sums."""

    def __init__(self) -> None:
        self._prefix = [0]
        self.gaps = 0
        self._lock = threading.Lock()

    def add(self, offset: int, size: int) -> None:
        """Record the size of the record at `offset` (offsets arrive in order)."""
        with self._lock:
            while len(self._prefix) - 1 < offset:  # a record we never saw: count it as 0 B
                self._prefix.append(self._prefix[-1])
                self.gaps += 1
            if len(self._prefix) - 1 == offset:
                self._prefix.append(self._prefix[-1] + size)

    @property
    def known(self) -> int:
        """One past the highest offset seen."""
        with self._lock:
            return len(self._prefix) - 1

    def between(self, lo: int, hi: int) -> int:
        """Bytes of records with lo <= offset < hi (within what was seen)."""
        with self._lock:
            top = len(self._prefix) - 1
            lo, hi = max(0, min(lo, top)), max(0, min(hi, top))
            return self._prefix[hi] - self._prefix[lo] if hi > lo else 0


@dataclass(slots=True)
class PolicySeries:
    """Samples of one retention policy, summed over topics."""

    name: str
    t: list[float] = field(default_factory=list)
    retained_bytes: list[int] = field(default_factory=list)
    minimum_bytes: list[int] = field(default_factory=list)
    retained_entries: list[int] = field(default_factory=list)
    minimum_entries: list[int] = field(default_factory=list)
    lost: set[tuple[int, int]] = field(default_factory=set)

    def summary(self, since: float) -> dict[str, Any]:
        idx = [i for i, t in enumerate(self.t) if t >= since] or list(range(len(self.t)))
        retained = sum(self.retained_bytes[i] for i in idx) / max(1, len(idx))
        minimum = sum(self.minimum_bytes[i] for i in idx) / max(1, len(idx))
        ratios = [
            self.retained_bytes[i] / self.minimum_bytes[i] for i in idx if self.minimum_bytes[i]
        ]
        return {
            "policy": self.name,
            "samples": len(idx),
            "mean_retained_bytes": round(retained),
            "mean_minimum_bytes": round(minimum),
            "ratio_to_minimum": round(retained / minimum, 3) if minimum else None,
            "max_sample_ratio": round(max(ratios), 3) if ratios else None,
            "end_retained_bytes": self.retained_bytes[-1] if self.retained_bytes else None,
            "end_retained_entries": self.retained_entries[-1] if self.retained_entries else None,
            "end_minimum_entries": self.minimum_entries[-1] if self.minimum_entries else None,
            "needed_entries_lost": len(self.lost),
        }


class Twins:
    """Copies every WAL record to the twin topics and indexes where each landed."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.topics = topics
        self.sizes: dict[str, OffsetBytes] = {
            twin: OffsetBytes() for t in topics for twin in self.names(t)
        }
        self.index: dict[str, dict[tuple[int, int], int]] = {twin: {} for twin in self.sizes}
        self._lock = threading.Lock()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "log_level": 3,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @staticmethod
    def names(topic: str) -> list[str]:
        return [f"{topic}.{suffix}" for suffix in TWINS]

    def create(self, admin: AdminClient) -> None:
        new = [
            NewTopic(
                f"{t}.{suffix}",
                num_partitions=1,
                replication_factor=1,
                config={"cleanup.policy": "delete", "segment.ms": "5000", **config},
            )
            for t in self.topics
            for suffix, config in TWINS.items()
        ]
        for future in admin.create_topics(new, request_timeout=15).values():
            future.result(timeout=30)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def tee(self, topic: str, key: bytes, value: bytes) -> None:
        row = json.loads(value)
        ident = (int(row["region_id"]), int(row["seq"]))
        size = len(key) + len(value)
        for twin in self.names(topic):
            self._producer.produce(
                twin,
                value,
                key,
                partition=0,
                on_delivery=self._delivered(twin, ident, size),
            )

    def _delivered(
        self, twin: str, ident: tuple[int, int], size: int
    ) -> Callable[[KafkaError | None, Message], None]:
        def done(err: KafkaError | None, msg: Message) -> None:
            offset = msg.offset()
            if err is not None or offset is None:
                logger.warning("twin write to %s failed: %s", twin, err)
                return
            self.sizes[twin].add(offset, size)
            with self._lock:
                self.index[twin][ident] = offset

        return done

    def offset_of(self, twin: str, ident: tuple[int, int]) -> int | None:
        with self._lock:
            return self.index[twin].get(ident)

    def close(self) -> None:
        self._producer.flush(30)
        self._stop.set()
        self._thread.join()


class Tail:
    """Reads every WAL topic as it is written, to know each record's size by offset."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.sizes = {t: OffsetBytes() for t in topics}
        self._consumer = KafkaConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"wal-retention-tail-{secrets.token_hex(4)}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 3,
            }
        )
        self._consumer.assign([TopicPartition(t, 0, 0) for t in topics])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, timeout=0.2):
                offset = msg.offset()
                if msg.error() is None and offset is not None:
                    size = len(msg.key() or b"") + len(msg.value() or b"")
                    self.sizes[str(msg.topic())].add(offset, size)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


class Sampler:
    """Measures each policy's retained WAL against what is needed, per sample."""

    def __init__(self, workload: Workload, tail: Tail, twins: Twins, admin: KafkaAdmin) -> None:
        self.workload = workload
        self.tail = tail
        self.twins = twins
        self.admin = admin
        self.series = {PURGE: PolicySeries(PURGE)} | {
            POLICY_OF_TWIN[s]: PolicySeries(POLICY_OF_TWIN[s]) for s in TWINS
        }

    def sample(self, elapsed: float) -> None:
        topics = self.workload.topics
        twins = [tw for t in topics for tw in Twins.names(t)]
        # Log starts first: a row still needed after this read was needed at it too.
        offsets = self.admin.offsets([*topics, *twins])
        needed: dict[str, list[tuple[int, int, int]]] = {t: [] for t in topics}
        for datanode in self.workload.datanodes.values():
            for region in list(datanode.regions.values()):
                for row in region.unflushed_rows():
                    needed[region.topic].append((row.entry_id, region.region_id, row.seq))
        totals = {name: [0, 0, 0, 0] for name in self.series}
        for topic in topics:
            off = offsets[topic]
            sizes = self.tail.sizes[topic]
            hw = min(off.high_watermark, sizes.known)
            low = min((e for e, _, _ in needed[topic]), default=hw)
            self._add(totals[PURGE], sizes, off.log_start_offset, min(low, hw), hw)
            for e, region_id, seq in needed[topic]:
                if e < off.log_start_offset:
                    self.series[PURGE].lost.add((region_id, seq))
            for suffix in TWINS:
                twin = f"{topic}.{suffix}"
                name = POLICY_OF_TWIN[suffix]
                toff = offsets[twin]
                tsizes = self.twins.sizes[twin]
                thw = min(toff.high_watermark, tsizes.known)
                placed = [
                    (o, r, s)
                    for _, r, s in needed[topic]
                    if (o := self.twins.offset_of(twin, (r, s))) is not None
                ]
                tlow = min((o for o, _, _ in placed), default=thw)
                self._add(totals[name], tsizes, toff.log_start_offset, min(tlow, thw), thw)
                for o, r, s in placed:
                    if o < toff.log_start_offset:
                        self.series[name].lost.add((r, s))
        for name, (rb, mb, re_, me) in totals.items():
            series = self.series[name]
            series.t.append(elapsed)
            series.retained_bytes.append(rb)
            series.minimum_bytes.append(mb)
            series.retained_entries.append(re_)
            series.minimum_entries.append(me)

    @staticmethod
    def _add(acc: list[int], sizes: OffsetBytes, log_start: int, low: int, hw: int) -> None:
        acc[0] += sizes.between(log_start, hw)
        acc[1] += sizes.between(low, hw)
        acc[2] += max(0, hw - log_start)
        acc[3] += max(0, hw - low)


def _human(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def run(args: argparse.Namespace, console: Console) -> tuple[dict[str, Any], Path]:
    """Run the benchmark; return the results and the run directory (config, logs, data)."""
    endpoints = ensure_up()
    bootstrap = args.kafka or endpoints.kafka_bootstrap
    run_id = secrets.token_hex(3)
    run_dir = Path(tempfile.mkdtemp(prefix=f"wal-retention-{run_id}-"))
    prefix = f"bench_{run_id}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tokens = {r: secrets.token_urlsafe(12) for r in ("datanode", "operator", "viewer")}
    metasrv_settings: dict[str, dict[str, Any]] = {
        "wal": {
            "broker_endpoints": [bootstrap],
            "num_topics": NUM_TOPICS,
            "topic_name_prefix": prefix,
            "auto_prune_interval": args.prune_interval,
            "region_stat_ttl": "10s",
            "flush_trigger_size": args.flush_trigger_size,
            "flush_wait_timeout": "10s",
            "checkpoint_interval": "2s",
        },
        "http": {"addr": f"127.0.0.1:{port}"},
        "kv": {"backend": "sql", "sql_url": f"sqlite:///{run_dir / 'kv.db'}"},
        "history": {"url": f"sqlite:///{run_dir / 'history.db'}"},
        "auth": {
            "datanode_tokens": [tokens["datanode"]],
            "operator_tokens": [tokens["operator"]],
            "viewer_tokens": [tokens["viewer"]],
        },
    }
    config = run_dir / "metasrv.toml"
    config.write_text(render_config(metasrv_settings))
    migrate(config, run_dir / "db-upgrade.log")
    topics = [f"{prefix}_{n}" for n in range(NUM_TOPICS)]
    admin_client = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    twins = Twins(bootstrap, topics)
    twins.create(admin_client)
    admin = KafkaAdmin(bootstrap)
    workload_config = WorkloadConfig(seed=args.seed)
    metasrv = MetasrvProcess(config, run_dir / "metasrv.log", url)
    workload: Workload | None = None
    tail: Tail | None = None
    try:
        metasrv.start()
        workload = Workload(
            workload_config,
            kafka_bootstrap=bootstrap,
            data_dir=run_dir / "datanodes",
            metasrv_url=url,
            operator_token=tokens["operator"],
            datanode_token=tokens["datanode"],
            tee=twins.tee,
        )
        workload.setup()
        if sorted(workload.topics) != sorted(topics):
            raise RuntimeError(f"unexpected topics {workload.topics}")
        tail = Tail(bootstrap, topics)
        sampler = Sampler(workload, tail, twins, admin)
        workload.start()
        started = time.monotonic()
        with console.status("running the workload") as status:

            def tick(elapsed: float) -> None:
                sampler.sample(elapsed)
                purge = sampler.series[PURGE]
                status.update(
                    f"{elapsed:.0f}/{args.duration:.0f}s  retained"
                    f" {_human(purge.retained_bytes[-1])}"
                    f" (minimum {_human(purge.minimum_bytes[-1])})"
                )
                if not metasrv.alive():
                    raise RuntimeError(f"metasrv exited:\n{metasrv.tail()}")

            workload.run(args.duration, tick=tick, tick_interval=args.sample_interval)
        workload.stop_writes()
        elapsed = time.monotonic() - started
        with MetasrvClient(url, token=tokens["operator"]) as operator:
            time.sleep(2.0)
            operator.wait(operator.purge(), timeout=120)
            sampler.sample(elapsed)
            history = operator.history(limit=1000)
        recoveries = workload.verify_all()
    finally:
        if workload is not None:
            workload.close()
        if tail is not None:
            tail.close()
        twins.close()
        metasrv.stop()
        admin.delete_topics([*topics, *(tw for t in topics for tw in Twins.names(t))])
        admin.close()
    since = args.duration / 2
    policies = {name: s.summary(since) for name, s in sampler.series.items()}
    ours = policies[PURGE]
    result = {
        "benchmark": "wal_retention",
        "run_id": run_id,
        "duration_s": args.duration,
        "sample_interval_s": args.sample_interval,
        "steady_state_from_s": since,
        "workload": asdict(workload_config),
        "metasrv": {k: v for k, v in metasrv_settings["wal"].items() if k != "broker_endpoints"},
        "twin_topic_configs": TWINS,
        "rows_acknowledged": sum(r.acknowledged for r in recoveries),
        "rows_missing_after_crash_restart": sum(r.missing for r in recoveries),
        "purges_completed": len(history),
        "entries_deleted_by_purges": sum(h.entries_deleted for h in history),
        "size_gaps": sum(s.gaps for s in tail.sizes.values()) if tail else None,
        "policies": policies,
        "target_ratio": TARGET_RATIO,
        "pass": bool(
            ours["ratio_to_minimum"] is not None
            and ours["ratio_to_minimum"] <= TARGET_RATIO
            and ours["needed_entries_lost"] == 0
            and sum(r.missing for r in recoveries) == 0
        ),
    }
    return result, run_dir


def print_report(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=(
            f"WAL retained, mean over the second half of a {result['duration_s']:.0f}s run "
            f"(3 nodes x 8 regions, {result['workload']['write_rate']:.0f} rows/s)"
        ),
        title_justify="left",
    )
    for column in ("policy", "bytes retained", "minimum needed", "x minimum", "max x"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    table.add_column("end: entries retained / needed", justify="right")
    table.add_column("needed entries lost", justify="right")
    for p in result["policies"].values():
        lost = p["needed_entries_lost"]
        table.add_row(
            p["policy"],
            _human(p["mean_retained_bytes"]),
            _human(p["mean_minimum_bytes"]),
            f"{p['ratio_to_minimum']:.2f}x" if p["ratio_to_minimum"] else "-",
            f"{p['max_sample_ratio']:.2f}x" if p["max_sample_ratio"] else "-",
            f"{p['end_retained_entries']} / {p['end_minimum_entries']}",
            f"[red]{lost}[/red]" if lost else "[green]0[/green]",
        )
    console.print(table)
    console.print(
        f"purges: {result['purges_completed']} completed, "
        f"{result['entries_deleted_by_purges']} entries deleted; rows acknowledged "
        f"{result['rows_acknowledged']}, missing after crash-restart of every datanode: "
        f"{result['rows_missing_after_crash_restart']}"
    )
    verdict = "[green]PASS[/green]" if result["pass"] else "[red]FAIL[/red]"
    console.print(
        f"target: metasrv purge <= {result['target_ratio']}x minimum, 0 needed entries lost: "
        f"{verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of writes")
    parser.add_argument("--sample-interval", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prune-interval", default="5s", help="metasrv wal.auto_prune_interval")
    parser.add_argument(
        "--flush-trigger-size", default="1MB", help="metasrv wal.flush_trigger_size"
    )
    parser.add_argument("--kafka", default=None, help="bootstrap (default: the local stack)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "wal_retention.json",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    console = Console(width=None if sys.stdout.isatty() else 120)
    result, run_dir = run(args, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result, console)
    console.print(f"results: {args.out}")
    if not result["pass"]:
        console.print(f"config, logs and datanode data kept in {run_dir}")
        return 1
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
