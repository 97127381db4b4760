"""A deterministic workload: N datanodes x M regions writing at a set rate.

The seed fixes everything that is not timing: region ids, which regions are idle or
slow to flush, per-region write shares, the order of writes and every payload.
Regions are registered with the metasrv (`POST /v1/regions`, operator token), which
picks their topics; without a metasrv they are spread round-robin over given topics.

Region kinds:
- normal: flushes on its own when its memtable reaches `flush_threshold_bytes`;
- slow: never flushes on its own, only when the metasrv asks (`flush_regions`);
- idle: receives no writes (it must not pin its topic: `topic_latest_entry_id`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from metasrv.errors import Conflict, InvalidArgument, MetasrvError, Unavailable
from metasrv.kafka import KafkaAdmin
from metasrv.model import region_id_of
from metasrv.wire import MetasrvClient
from toolbox.simulator._datanode import SimDatanode
from toolbox.simulator._region import RecoveryReport, VerifyReport
from toolbox.simulator._wal import Tee

logger = logging.getLogger(__name__)


class RegionKind(Enum):
    """How a simulated region behaves."""

    NORMAL = "normal"
    SLOW = "slow"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Shape of a simulated cluster's write load."""

    nodes: int = 3
    """Datanodes."""
    regions_per_node: int = 8
    """Regions hosted by each datanode."""
    write_rate: float = 200.0
    """Rows per second over the whole cluster."""
    row_bytes: int = 200
    """Payload characters per row."""
    flush_threshold_bytes: int = 64 * 1024
    """Memtable size at which a normal region flushes on its own."""
    slow_fraction: float = 0.25
    """Share of regions that flush only when the metasrv asks."""
    idle_fraction: float = 0.125
    """Share of regions that receive no writes."""
    heartbeat_interval: float = 1.0
    """Seconds between heartbeats of each datanode."""
    seed: int = 7
    """Seed of every choice the workload makes."""
    table_id: int = 1024
    """Table id of node 0's regions (node i uses table_id + i)."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.regions_per_node < 1:
            raise InvalidArgument("a workload needs at least one node and one region per node")
        if self.write_rate < 0 or self.row_bytes < 1:
            raise InvalidArgument("write_rate must be >= 0 and row_bytes >= 1")
        if not (0 <= self.slow_fraction + self.idle_fraction <= 1):
            raise InvalidArgument("slow_fraction + idle_fraction must be within [0, 1]")


@dataclass(frozen=True, slots=True)
class RegionPlan:
    """One region of the workload, as the seed decided it."""

    region_id: int
    """64-bit region id."""
    node_id: int
    """Hosting datanode."""
    kind: RegionKind
    """Normal, slow or idle."""
    weight: float
    """Relative share of its node's writes (0 for idle regions)."""


@dataclass(frozen=True, slots=True)
class NodeRecovery:
    """The result of restarting one datanode and verifying its regions."""

    node_id: int
    """Datanode restarted."""
    recoveries: tuple[RecoveryReport, ...]
    """Per-region replay reports."""
    verifications: tuple[VerifyReport, ...]
    """Per-region verification reports."""

    @property
    def acknowledged(self) -> int:
        """Rows acknowledged over the datanode's life."""
        return sum(v.acknowledged for v in self.verifications)

    @property
    def recovered_from_sst(self) -> int:
        """Acknowledged rows found in SSTs."""
        return sum(v.recovered_from_sst for v in self.verifications)

    @property
    def replayed(self) -> int:
        """Rows replayed from Kafka."""
        return sum(r.replayed for r in self.recoveries)

    @property
    def missing(self) -> int:
        """Acknowledged rows not recovered: must be 0."""
        return sum(v.missing for v in self.verifications)


def drive_writes(
    datanode: SimDatanode,
    weights: Mapping[int, float],
    *,
    rate: float,
    row_bytes: int,
    rng: random.Random,
    stop: threading.Event,
    on_write: Callable[[int, bool], None] | None = None,
) -> None:
    """Write rows to the datanode's regions at `rate` per second until `stop` is set.

    Regions are picked by `weights`; payloads come from `rng` (so the sequence of writes is
    fixed by its seed). Writes to a region that is down are skipped and reported to
    `on_write(region_id, False)`; accepted ones as `on_write(region_id, True)`.
    """
    ids = list(weights)
    shares = [weights[i] for i in ids]
    interval = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        region_id = rng.choices(ids, shares)[0]
        payload = format(rng.getrandbits(row_bytes * 4), f"0{row_bytes}x")
        region = datanode.regions.get(region_id)
        accepted = False
        if datanode.alive and region is not None:
            try:
                region.write(payload)
                accepted = True
            except MetasrvError:
                pass  # the node went down or Kafka refused: the write is not acknowledged
        if on_write is not None:
            on_write(region_id, accepted)
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        elif delay < -1.0:
            next_at = time.monotonic()  # fell a second behind: don't burst to catch up


def _register(client: MetasrvClient, plan: RegionPlan, timeout: float = 30.0) -> str:
    """Register one region; retries while the leader is still loading (503)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.add_region(plan.region_id, plan.node_id).topic
        except Conflict:  # registered by an earlier run on this key prefix
            return client.region(plan.region_id).topic
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def plan_regions(config: WorkloadConfig) -> list[RegionPlan]:
    """The workload's regions, decided by the seed alone."""
    rng = random.Random(config.seed)
    total = config.nodes * config.regions_per_node
    ids = [
        (node, region_id_of(config.table_id + node, number))
        for node in range(config.nodes)
        for number in range(config.regions_per_node)
    ]
    order = list(range(total))
    rng.shuffle(order)
    idle = round(total * config.idle_fraction)
    slow = round(total * config.slow_fraction)
    kinds = {}
    for rank, index in enumerate(order):
        kinds[index] = (
            RegionKind.IDLE
            if rank < idle
            else RegionKind.SLOW
            if rank < idle + slow
            else RegionKind.NORMAL
        )
    plans = []
    for index, (node, region_id) in enumerate(ids):
        kind = kinds[index]
        weight = 0.0 if kind is RegionKind.IDLE else rng.uniform(0.5, 2.0)
        plans.append(RegionPlan(region_id, node, kind, weight))
    return plans


@dataclass(slots=True)
class _Counters:
    written: int = 0
    rejected_writes: int = 0
    per_region: dict[int, int] = field(default_factory=dict)


class Workload:
    """Runs simulated datanodes and drives their writes."""

    def __init__(
        self,
        config: WorkloadConfig,
        *,
        kafka_bootstrap: str,
        data_dir: str | Path,
        metasrv_url: str | None = None,
        operator_token: str | None = None,
        datanode_token: str | None = None,
        topics: Sequence[str] | None = None,
        tee: Tee | None = None,
    ) -> None:
        """`topics` is needed (and only used) without a metasrv."""
        if metasrv_url is None and not topics:
            raise InvalidArgument("a workload without a metasrv needs topics")
        self.config = config
        self.kafka_bootstrap = kafka_bootstrap
        self.data_dir = Path(data_dir)
        self.metasrv_url = metasrv_url
        self.operator_token = operator_token
        self.datanode_token = datanode_token
        self.plans = plan_regions(config)
        self.topic_of: dict[int, str] = {}
        self.datanodes: dict[int, SimDatanode] = {}
        self._static_topics = list(topics or [])
        self._tee = tee
        self._stop = threading.Event()
        self._writers: list[threading.Thread] = []
        self._counters = _Counters()
        self._counter_lock = threading.Lock()
        self._fatal: BaseException | None = None

    # --- setup --------------------------------------------------------------------------

    def setup(self) -> None:
        """Register the regions, create the datanodes and open their regions."""
        if self.metasrv_url is not None:
            with MetasrvClient(self.metasrv_url, token=self.operator_token, timeout=15.0) as client:
                for plan in self.plans:
                    self.topic_of[plan.region_id] = _register(client, plan)
        else:
            for index, plan in enumerate(self.plans):
                self.topic_of[plan.region_id] = self._static_topics[
                    index % len(self._static_topics)
                ]
        admin = KafkaAdmin(self.kafka_bootstrap)
        try:
            admin.ensure_topics(set(self.topic_of.values()))
        finally:
            admin.close()
        for node in range(self.config.nodes):
            datanode = SimDatanode(
                node,
                self.metasrv_url,
                self.datanode_token,
                self.kafka_bootstrap,
                self.data_dir / f"datanode_{node}",
                heartbeat_interval=self.config.heartbeat_interval,
                flush_threshold_bytes=self.config.flush_threshold_bytes,
                tee=self._tee,
            )
            for plan in self.plans:
                if plan.node_id == node:
                    threshold = (
                        None if plan.kind is RegionKind.SLOW else self.config.flush_threshold_bytes
                    )
                    datanode.add_region(
                        plan.region_id,
                        self.topic_of[plan.region_id],
                        flush_threshold_bytes=threshold,
                    )
            self.datanodes[node] = datanode

    @property
    def topics(self) -> list[str]:
        """Topics the workload's regions write to."""
        return sorted(set(self.topic_of.values()))

    # --- running ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the datanodes' loops and one writer thread per datanode."""
        for datanode in self.datanodes.values():
            datanode.start()
        self._stop.clear()
        for node in self.datanodes:
            thread = threading.Thread(
                target=self._write_loop, args=(node,), name=f"writes-{node}", daemon=True
            )
            self._writers.append(thread)
            thread.start()

    def _write_loop(self, node: int) -> None:
        try:
            self._write_loop_inner(node)
        except BaseException as exc:  # surfaced by check()
            logger.exception("writer of datanode %s died", node)
            self._fatal = exc

    def _write_loop_inner(self, node: int) -> None:
        cfg = self.config
        plans = [p for p in self.plans if p.node_id == node and p.weight > 0]
        total_weight = sum(p.weight for p in self.plans)
        if not plans or cfg.write_rate <= 0 or total_weight <= 0:
            return
        drive_writes(
            self.datanodes[node],
            {p.region_id: p.weight for p in plans},
            rate=cfg.write_rate * sum(p.weight for p in plans) / total_weight,
            row_bytes=cfg.row_bytes,
            rng=random.Random(cfg.seed * 1_000_003 + node),
            stop=self._stop,
            on_write=self._count,
        )

    def _count(self, region_id: int, accepted: bool) -> None:
        with self._counter_lock:
            if accepted:
                self._counters.written += 1
                self._counters.per_region[region_id] = (
                    self._counters.per_region.get(region_id, 0) + 1
                )
            else:
                self._counters.rejected_writes += 1

    def check(self) -> None:
        """Raise the error that killed a writer or datanode loop, if any."""
        if self._fatal is not None:
            raise self._fatal
        for datanode in self.datanodes.values():
            datanode.check()

    def run(
        self,
        duration: float,
        *,
        tick: Callable[[float], None] | None = None,
        tick_interval: float = 1.0,
    ) -> None:
        """Run `duration` seconds, calling `tick(elapsed)` every `tick_interval` seconds."""
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            self.check()
            if tick is not None:
                tick(elapsed)
            if elapsed >= duration:
                return
            time.sleep(min(tick_interval, max(0.0, duration - elapsed)))

    def stop_writes(self) -> None:
        """Stop the writer threads (datanodes keep heartbeating)."""
        self._stop.set()
        for thread in self._writers:
            thread.join()
        self._writers = []

    @property
    def written(self) -> int:
        """Rows handed to regions so far."""
        with self._counter_lock:
            return self._counters.written

    @property
    def acknowledged(self) -> int:
        """Rows acknowledged by the live regions (since each datanode's last start)."""
        return sum(r.acknowledged for dn in self.datanodes.values() for r in dn.regions.values())

    # --- faults -------------------------------------------------------------------------

    def kill(self, node_id: int) -> None:
        """Crash a datanode (its writer thread skips it until restarted)."""
        self.datanodes[node_id].kill()

    def restart(self, node_id: int) -> NodeRecovery:
        """Restart a datanode from its data dir (replay from the metasrv's start) and verify."""
        datanode = self.datanodes[node_id]
        recoveries = datanode.restart()
        return NodeRecovery(node_id, tuple(recoveries), tuple(datanode.verify()))

    def verify_all(self) -> list[NodeRecovery]:
        """Crash-restart every datanode and verify all acknowledged rows (ends the writes)."""
        self.stop_writes()
        results = []
        for node_id in self.datanodes:
            self.kill(node_id)
            results.append(self.restart(node_id))
        return results

    def close(self) -> None:
        """Stop writes and datanodes."""
        self.stop_writes()
        for datanode in self.datanodes.values():
            datanode.close()
