"""A metasrv cluster under write load for fault tests: real processes, real services.

`FaultCluster` runs N `metasrv start` processes on the suite's own etcd (one key prefix)
and Kafka (one topic prefix), the SQL history in a PostgreSQL schema, and simulated
datanodes (toolbox.simulator) that write real WAL records, flush SSTs and heartbeat to
whichever metasrv leads (tests/faults/_client.py). An `InvariantMonitor` samples the
safety invariants all along. `recovery_check()` is the end-of-scenario proof: every
datanode is crashed and restarted, replays from the leader's replay-start with
`auto.offset.reset=error`, and every acknowledged row must be recovered.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metasrv import keys
from metasrv.archive import ObjectStore
from metasrv.errors import MetasrvError, NotLeader, Unavailable, WalDataLoss
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.model import PartitionOffsets
from metasrv.settings import ArchiveSettings
from procedures import ProcedureRecord, state_key
from tests._wait import wait_until, wait_until_or_none
from tests.faults._client import ClusterClient
from tests.faults._daemons import Daemon
from tests.faults._monitor import InvariantMonitor
from tests.faults._summary import FaultSummary
from toolbox.simulator import SimDatanode, SimRegion, Workload, WorkloadConfig, render_config
from toolbox.simulator import free_port as _free_port

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterSpec:
    """Shape of a fault cluster: small, so a 2-core machine runs it next to other work."""

    daemons: int = 3
    """`metasrv start` processes."""
    nodes: int = 3
    """Simulated datanodes."""
    regions_per_node: int = 6
    """Regions per datanode."""
    num_topics: int = 3
    """WAL topic pool size."""
    lease_secs: int = 3
    """Election lease (2 s made a loaded 2-core machine fail over by itself: one
    keepalive slower than lease/3 makes a leader step down)."""
    write_rate: float = 120.0
    """Rows per second over the cluster."""
    heartbeat_interval: float = 0.5
    """Seconds between a datanode's heartbeats."""
    seed: int = 11
    """Workload seed."""


@dataclass
class RecoveryResult:
    """What one recovery check found."""

    acknowledged: int = 0
    """Acknowledged rows verified (cumulative ledgers of every region)."""
    replayed: int = 0
    """Rows replayed from Kafka."""
    missing: int = 0
    """Acknowledged rows not recovered."""
    data_loss: list[str] = field(default_factory=list)
    """Replays that failed because Kafka no longer held the replay start."""
    violations: list[str] = field(default_factory=list)
    """Invariant violations seen by the monitor since the cluster started."""

    def assert_ok(self) -> None:
        """Fail with everything that went wrong."""
        problems = [*self.data_loss, *self.violations]
        if self.missing:
            problems.append(f"{self.missing} acknowledged rows not recovered")
        assert not problems, "\n".join(problems)


def _daemon_config(
    spec: ClusterSpec,
    *,
    name: str,
    node: str,
    port: int,
    kafka: str,
    etcd: list[str],
    history_url: str,
    archive: dict[str, Any] | None = None,
) -> str:
    sections: dict[str, dict[str, Any]] = {"wal.archive": archive} if archive else {}
    return render_config(
        {
            "wal": {
                "broker_endpoints": kafka.split(","),
                "replication_factor": 3,
                "num_topics": spec.num_topics,
                "topic_name_prefix": f"{name}_wal",
                "auto_prune_interval": "2s",
                "auto_prune_parallelism": 4,
                # Small, so most purges go through the flush step (and its wait).
                "flush_trigger_size": "4KB",
                "flush_wait_timeout": "3s",
                "region_stat_ttl": "10s",
                "checkpoint_interval": "500ms",
            },
            # Retries outlast every outage the suite injects (the backoff caps at 30 s).
            "procedure": {"max_retry_times": 20, "retry_delay": "100ms", "finished_ttl": "30m"},
            "http": {"addr": f"127.0.0.1:{port}"},
            "kv": {"backend": "etcd", "etcd_endpoints": etcd, "key_prefix": f"{name}/"},
            "history": {"url": history_url},
            "election": {"lease_secs": spec.lease_secs, "node_name": node},
            "reconcile": {"stat_history_interval": "0s"},
            **sections,
        }
    )


class FaultCluster:
    """Daemons + datanodes + monitor (see the module docstring)."""

    def __init__(
        self,
        *,
        name: str,
        kafka: str,
        etcd: list[str],
        history_url: str,
        workdir: Path,
        summary: FaultSummary,
        spec: ClusterSpec | None = None,
        archive: dict[str, Any] | None = None,
        extra_check: Callable[[dict[str, PartitionOffsets]], list[str]] | None = None,
    ) -> None:
        """`archive`: the daemons' `[wal.archive]` section (the datanodes replay through
        it too); `extra_check`: more invariants the monitor samples (`InvariantMonitor`)."""
        self.name = name
        self.archive = archive
        self.kafka = kafka
        self.etcd = etcd
        self.history_url = history_url
        self.workdir = workdir
        self.summary = summary
        self.spec = spec or ClusterSpec()
        self.kv = EtcdKv(etcd, f"{name}/", timeout=3.0)
        self.admin = KafkaAdmin(kafka, request_timeout=5.0)
        self.daemons = [
            Daemon(f"ms{i}", _free_port(), workdir / f"ms{i}.toml", workdir)
            for i in range(self.spec.daemons)
        ]
        self._workload: Workload | None = None
        self.monitor = InvariantMonitor(
            name,
            etcd=etcd,
            kafka=kafka,
            datanodes=lambda: self.workload.datanodes.values() if self._workload else (),
            topics=lambda: self.workload.topics if self._workload else [],
            summary=summary,
            extra_check=extra_check,
        )

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def workload(self) -> Workload:
        """The simulated datanodes and their writers."""
        if self._workload is None:
            raise RuntimeError("cluster not started")
        return self._workload

    def start(self) -> None:
        """Start the daemons (the first one leads), register and start the datanodes."""
        for daemon in self.daemons:
            daemon.config.write_text(
                _daemon_config(
                    self.spec,
                    name=self.name,
                    node=daemon.name,
                    port=daemon.port,
                    kafka=self.kafka,
                    etcd=self.etcd,
                    history_url=self.history_url,
                    archive=self.archive,
                )
            )
        first, *rest = self.daemons
        first.start(expect_leader=True)
        with ThreadPoolExecutor(len(rest) or 1) as pool:
            for started in [pool.submit(d.start) for d in rest]:
                started.result()
        spec = self.spec
        workload = Workload(
            WorkloadConfig(
                nodes=spec.nodes,
                regions_per_node=spec.regions_per_node,
                write_rate=spec.write_rate,
                row_bytes=120,
                flush_threshold_bytes=12 * 1024,
                slow_fraction=0.34,
                idle_fraction=0.17,
                heartbeat_interval=spec.heartbeat_interval,
                seed=spec.seed,
            ),
            kafka_bootstrap=self.kafka,
            data_dir=self.workdir / "datanodes",
            metasrv_url=first.url,
        )
        self._workload = workload
        workload.setup()
        for datanode in workload.datanodes.values():
            if datanode.client is not None:
                datanode.client.close()
            datanode.client = ClusterClient([d.url for d in self.daemons])
            if self.archive:
                datanode.archive = ObjectStore(ArchiveSettings.model_validate(self.archive))
        workload.start()
        self.monitor.start()

    def close(self) -> None:
        """Stop everything and delete the cluster's keys and topics."""
        with contextlib.suppress(Exception):
            self.monitor.stop()
        if self._workload is not None:
            with contextlib.suppress(Exception):
                self._workload.close()
        for daemon in self.daemons:
            daemon.stop()
        with contextlib.suppress(MetasrvError):
            self.kv.delete_prefix("")
        with contextlib.suppress(MetasrvError):
            self.admin.delete_topics(
                t for t in self.admin.list_topics() if t.startswith(f"{self.name}_")
            )
        self.kv.close()
        self.admin.close()
        # Producers of crashed datanodes linger until collected and log reconnect errors
        # once the suite's broker is stopped.
        gc.collect()

    # --- leadership ---------------------------------------------------------------------

    def views(self) -> dict[str, dict[str, Any]]:
        """`GET /v1/leader` of every answering daemon, by name."""
        out = {}
        for daemon in self.daemons:
            view = daemon.view()
            if view is not None:
                out[daemon.name] = view
        return out

    def wait_leader(
        self, timeout: float = 60.0, *, exclude: Daemon | None = None, after_term: int = 0
    ) -> tuple[Daemon, int]:
        """A serving leader (not `exclude`, with a term other than `after_term`) and its term."""

        def leader() -> tuple[Daemon, int] | None:
            for daemon in self.daemons:
                if daemon is exclude:
                    continue
                view = daemon.view()
                if (
                    view is not None
                    and view.get("is_leader")
                    and view.get("serving")
                    and int(view.get("term") or 0) != after_term
                ):
                    return daemon, int(view["term"])
            return None

        try:
            return wait_until(leader, "a serving leader", timeout=timeout, interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.views()}") from None

    def heal(self, timeout: float = 90.0) -> Daemon:
        """Continue paused daemons, restart dead ones, wait for a serving leader."""
        for daemon in self.daemons:
            daemon.resume()
        for daemon in self.daemons:
            if not daemon.alive:
                daemon.start(timeout=timeout)
        leader, _ = self.wait_leader(timeout)
        return leader

    # --- procedures (read from the kv backend, as the daemons store them) ----------------

    def procedure_records(self) -> dict[str, ProcedureRecord]:
        """Every procedure record in the cluster's kv prefix."""
        out = {}
        for kv in self.kv.scan(keys.PROCEDURE_PREFIX):
            procedure_id = kv.key.removeprefix(keys.PROCEDURE_PREFIX).split("/", 1)[0]
            if kv.key == state_key(procedure_id):
                record = ProcedureRecord.from_json(kv.value)
                out[record.id] = record
        return out

    def unfinished(self) -> dict[str, ProcedureRecord]:
        """Procedure records not in a terminal state."""
        return {i: r for i, r in self.procedure_records().items() if not r.state.terminal}

    def wait_in_flight(
        self, timeout: float = 30.0, steps: tuple[str, ...] = ("flush", "purge")
    ) -> list[ProcedureRecord]:
        """Unfinished purges: for the first half of `timeout` only those started in one of
        `steps`, then any; [] if none appeared. An opportunity to fault in the middle of a
        purge, not an outcome: the caller asserts on the answer when it needs one."""

        def in_steps() -> list[ProcedureRecord]:
            records = self.unfinished().values()
            return [r for r in records if r.step in steps and r.started_at is not None]

        def any_unfinished() -> list[ProcedureRecord]:
            return list(self.unfinished().values())

        return (
            wait_until_or_none(in_steps, timeout=timeout / 2, interval=0.05)
            or wait_until_or_none(any_unfinished, timeout=timeout / 2, interval=0.05)
            or []
        )

    def finish_resumed(
        self, ids: Iterable[str], timeout: float = 90.0, *, count: bool = True
    ) -> list[ProcedureRecord]:
        """Wait until each procedure reached a terminal state; count them as resumed (by a
        later leader term) unless `count` is False."""
        wanted = set(ids)
        pending: dict[str, object] = {}

        def finished() -> list[ProcedureRecord] | None:
            records = self.procedure_records()
            missing = wanted - set(records)
            assert not missing, f"procedure records vanished: {missing}"
            pending.clear()
            pending.update(
                (i, (records[i].state, records[i].step, records[i].error))
                for i in wanted
                if not records[i].state.terminal
            )
            return None if pending else [records[i] for i in wanted]

        done: list[ProcedureRecord] = []
        if wanted:
            try:
                done = wait_until(finished, "resumed procedures to finish", timeout=timeout)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; unfinished: {pending}") from None
        if count:
            self.summary.resumed_procedures(len(done))
        return done

    # --- faults -------------------------------------------------------------------------

    def kill_leader(self) -> tuple[Daemon, list[str]]:
        """SIGKILL the leader; return it and the procedures its death interrupted."""
        leader, _ = self.wait_leader()
        leader.kill()
        self.summary.fault()
        interrupted = sorted(self.unfinished())
        logger.info("killed leader %s; interrupted %s", leader.name, interrupted)
        return leader, interrupted

    # --- checks -------------------------------------------------------------------------

    def wait_purge_progress(self, before: dict[str, int], timeout: float = 60.0) -> None:
        """Some topic's `pruned_entry_id` moves past `before` (purges work again)."""

        def progressed() -> bool:
            self.workload.check()
            with contextlib.suppress(MetasrvError):  # a service may still be coming back
                self.monitor.sample()
            return any(m > before.get(t, -1) for t, m in self.monitor.markers.items())

        try:
            wait_until(progressed, "a purge after the fault", timeout=timeout, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; markers: {self.monitor.markers}") from None

    def run_for(self, seconds: float) -> None:
        """Let the load run for `seconds`, surfacing a crashed writer or datanode loop: a
        deliberate duration (a fault held, load between two steps), never a wait for
        something to happen."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.workload.check()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def recovery_check(self, timeout: float = 120.0) -> RecoveryResult:
        """Crash and restart every datanode; every acknowledged row must be recovered.

        Writes stop first; the needed-entries invariant is sampled on the final state;
        then each datanode replays from the leader's replay-start (`auto.offset.reset=error`)
        and verifies its ledger. On `WalDataLoss` the rows Kafka still holds are replayed
        so the loss is counted row by row. Writes resume afterwards.
        """
        workload = self.workload
        workload.stop_writes()
        result = RecoveryResult()
        try:
            self.monitor.sample()
        except MetasrvError as exc:
            raise AssertionError(f"final invariant sample failed: {exc}") from exc
        for datanode in workload.datanodes.values():
            self.recover_node(datanode, result, timeout=timeout)
        result.violations = self.monitor.take_violations()
        workload.start()
        return result

    def assert_recovers(self) -> RecoveryResult:
        """`recovery_check()`, which must find nothing wrong, and some rows to verify."""
        result = self.recovery_check()
        result.assert_ok()
        assert result.acknowledged > 0, "no acknowledged rows: the load did not run"
        return result

    def recover_node(
        self, datanode: SimDatanode, result: RecoveryResult, *, timeout: float = 120.0
    ) -> None:
        """Crash one datanode, restart it from the leader's replay-start, verify its rows
        (into `result` and the session summary). Writes to it resume by themselves."""
        reports = self._restart(datanode, timeout, result)
        result.replayed += sum(r.replayed for r in reports)
        for v in datanode.verify():
            result.acknowledged += v.acknowledged
            result.missing += v.missing
            self.summary.verified_rows(self.name, v.region_id, v.acknowledged)
            if v.missing:
                self.summary.lost_rows(self.name, v.region_id, list(v.missing_entry_ids), v.missing)
        logger.info("datanode %s recovered and verified", datanode.node_id)

    def _restart(self, datanode: SimDatanode, timeout: float, result: RecoveryResult) -> list[Any]:
        def restarted() -> tuple[list[Any]]:
            try:
                return (datanode.restart(),)
            except WalDataLoss as exc:
                result.data_loss.append(f"datanode {datanode.node_id}: {exc}")
                return (datanode.restart(self._replay_what_is_left(datanode)),)

        # Unavailable, NotLeader: no serving leader yet (an election under way, followers
        # still naming the old leader, or a new one loading the map): try again.
        (reports,) = wait_until(
            restarted,
            f"datanode {datanode.node_id} to restart from a serving leader's replay start",
            timeout=timeout,
            interval=0.5,
            ignore=(Unavailable, NotLeader),
        )
        return reports

    def _replay_what_is_left(self, datanode: SimDatanode) -> Callable[[int], int]:
        client = datanode.client
        assert client is not None
        topics = {
            rid: manifest.topic
            for rid, path in datanode.region_dirs().items()
            if (manifest := SimRegion.stored_manifest(path)) is not None
        }
        low = {t: o.log_start_offset for t, o in self.admin.offsets(set(topics.values())).items()}
        return lambda rid: max(client.replay_start(rid), low[topics[rid]])
