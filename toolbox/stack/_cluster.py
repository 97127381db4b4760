"""The production-shaped cluster: bring it up, signal its members, read who leads.

`cluster_up` starts a Kafka cluster (one KRaft controller, brokers 1..3, replication
factor 3, `min.insync.replicas` 2) and a 3-member etcd under `<state dir>/cluster/`, and
returns a `Cluster`: the handle fault tests use to kill, pause, stop and start single
brokers and members, and to ask which broker leads a partition and which member leads etcd.

Several test sessions share one cluster, so faults are taken in turn: the first `kill`,
`pause` or `stop` of a session takes the cluster's fault lock (`cluster/.faults.lock`,
waiting while another session holds it), and `heal()` (or a `start` that leaves every
process running) gives it back; a session that exits releases it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from confluent_kafka import KafkaException

from metasrv.errors import InvalidArgument, ServiceError
from toolbox.stack._config import StackConfig, cluster_endpoints_of
from toolbox.stack._etcd_cluster import etcd_members
from toolbox.stack._kafka import Kafka
from toolbox.stack._kafka_cluster import (
    CONTROLLER_NAME,
    KafkaBroker,
    admin_client,
    broker_name,
    kafka_nodes,
    registered_brokers,
)
from toolbox.stack._process import (
    dir_lock,
    pid_alive,
    process_stopped,
    wait_until,
)
from toolbox.stack._service import Service
from toolbox.stack._stack import ServiceStatus, _state_lock

logger = logging.getLogger(__name__)


FAULT_LOCK_WAIT = 900.0
"""Seconds a session waits for another session's faults to heal before giving up."""
PAUSE_WAIT = 5.0
"""Seconds `pause` waits for a SIGSTOPped process to show as stopped."""

# One handle per lock file per process: two handles of one process would block each other.
_fault_locks: dict[Path, IO[str]] = {}
_fault_guard = threading.Lock()


def _take_fault_lock(path: Path, wait: float) -> bool:
    """Hold the lock (waiting up to `wait` s); False when this process held it already."""
    with _fault_guard:
        if path in _fault_locks:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 (held until released)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "?"
                    handle.close()
                    raise ServiceError(
                        f"another session (pid {holder}) has held the cluster's fault lock "
                        f"{path} for over {wait:.0f}s without healing",
                        details={"lock": str(path)},
                    ) from None
                time.sleep(0.5)
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        _fault_locks[path] = handle
        return True


def _release_fault_lock(path: Path) -> None:
    with _fault_guard:
        handle = _fault_locks.pop(path, None)
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def _parallel(fn: Callable[[Service], object], services: list[Service]) -> None:
    """`fn` on every service at once; the first error is raised after all finished."""
    if not services:
        return
    with ThreadPoolExecutor(len(services)) as pool:
        for done in [pool.submit(fn, svc) for svc in services]:
            done.result()


class Cluster:
    """Handle on the running cluster; every method takes service names
    ("kafka-controller", "kafka-broker-1".."kafka-broker-3", "etcd-1".."etcd-3")."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        ends = cluster_endpoints_of(cfg)
        self.kafka_bootstrap: str = ends.kafka_bootstrap
        """Every broker, "host:p1,host:p2,host:p3"."""
        self.etcd_endpoints: list[str] = ends.etcd_endpoints
        """Every member's client endpoint, "host:port"."""
        self._kafka = kafka_nodes(cfg)
        self._etcd = etcd_members(cfg)
        self._services: dict[str, Service] = {s.name: s for s in [*self._etcd, *self._kafka]}
        self.controller: str = CONTROLLER_NAME
        self.brokers: list[str] = [b.name for b in self._brokers]
        self.etcd_members: list[str] = [s.name for s in self._etcd]

    @property
    def names(self) -> list[str]:
        """Every service, in start order (etcd members, controller, brokers)."""
        return list(self._services)

    def service(self, name: str) -> Service:
        """The service object called `name`."""
        try:
            return self._services[name]
        except KeyError:
            known = ", ".join(self._services)
            raise InvalidArgument(
                f"unknown cluster service {name!r}; expected one of {known}"
            ) from None

    def _pick(self, names: tuple[str, ...]) -> list[Service]:
        return [self.service(n) for n in names]

    @property
    def _fault_lock(self) -> Path:
        return self.cfg.cluster_dir / ".faults.lock"

    def _disrupting(self, names: tuple[str, ...]) -> None:
        """Validate `names`, then take the fault lock (faults of other sessions wait)."""
        self._pick(names)
        _take_fault_lock(self._fault_lock, FAULT_LOCK_WAIT)

    def _whole(self) -> bool:
        return all(self._running(svc) for svc in self._services.values())

    @contextmanager
    def _lock(self) -> Iterator[None]:
        with dir_lock(self.cfg.cluster_dir):
            yield

    # --- processes ----------------------------------------------------------------------

    def pid(self, name: str) -> int | None:
        """Pid of the running process (None when it is not running)."""
        return self.service(name).pid()

    def _signal(self, name: str, sig: signal.Signals) -> int:
        pid = self.pid(name)
        if pid is None:
            raise ServiceError(f"{name} is not running", details={"service": name})
        os.kill(pid, sig)
        return pid

    def kill(self, *names: str) -> None:
        """SIGKILL each; returns once the processes are gone and their ports closed."""
        self._disrupting(names)
        killed = [(self.service(name), self._signal(name, signal.SIGKILL)) for name in names]
        deadline = time.monotonic() + 10
        for svc, pid in killed:
            # A dying JVM's main thread is a zombie before its other threads let go of
            # the sockets: wait for the port too, so a restart does not find it taken.
            while (pid_alive(pid) or svc.listening()) and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
                time.sleep(0.05)

    def pause(self, *names: str) -> None:
        """SIGSTOP each (frozen: connections stay open, nothing answers); returns once
        every one is stopped (a busy machine can take a moment to stop every thread)."""
        self._disrupting(names)
        paused = [self._signal(name, signal.SIGSTOP) for name in names]
        deadline = time.monotonic() + PAUSE_WAIT
        while not all(map(process_stopped, paused)) and time.monotonic() < deadline:
            time.sleep(0.01)

    def resume(self, *names: str) -> None:
        """SIGCONT each that runs (a no-op for one that is not paused)."""
        for name in names:
            pid = self.pid(name)
            if pid is not None:
                os.kill(pid, signal.SIGCONT)

    def stop(self, *names: str) -> None:
        """SIGTERM each (all at once), SIGKILL what outlives its grace period."""
        self._disrupting(names)
        self.resume(*names)
        _parallel(lambda svc: svc.stop(), self._pick(names))

    def start(self, *names: str, timeout: float | None = None) -> None:
        """Start each that is not running (continue each that is paused), then wait until
        every one is healthy: a broker registered and unfenced, an etcd member serving
        linearizable reads, the controller listening.

        Waits while another session's faults hold the cluster (never restarts what that
        session took down)."""
        services = self._pick(names)
        took = _take_fault_lock(self._fault_lock, FAULT_LOCK_WAIT)
        try:
            self._launch_missing(services)
            limit = timeout if timeout is not None else self.cfg.ready_timeout
            _parallel(lambda svc: self._wait_healthy(svc, limit), services)
        finally:
            if took or self._whole():
                _release_fault_lock(self._fault_lock)

    def _launch_missing(self, services: list[Service]) -> None:
        with self._lock():
            missing: list[Service] = []
            for svc in services:
                pid = svc.pid()
                if pid is not None:
                    if process_stopped(pid):
                        os.kill(pid, signal.SIGCONT)
                    continue
                # A process killed a moment ago may still hold its port.
                deadline = time.monotonic() + 10
                while svc.listening() and time.monotonic() < deadline:
                    time.sleep(0.2)
                if svc.listening():
                    raise ServiceError(
                        f"{svc.name}: port {svc.port} is taken by a process this state dir "
                        f"({self.cfg.cluster_dir}) did not start",
                        details={"service": svc.name, "endpoint": svc.endpoint},
                    )
                missing.append(svc)
            # Formatting a Kafka node's storage is a JVM run of its own: all at once.
            _parallel(lambda svc: svc.install(), missing)
            for svc in missing:
                svc.launch()

    @staticmethod
    def _wait_healthy(svc: Service, timeout: float) -> None:
        wait_until(
            svc.name,
            lambda: svc.listening() and svc.healthy(),
            timeout=timeout,
            log_file=svc.log_file,
            alive=svc.process_alive,
        )

    def heal(self) -> None:
        """Continue every paused process and start every stopped one; wait until healthy."""
        self.start(*self.names)
        _release_fault_lock(self._fault_lock)

    # --- who leads ----------------------------------------------------------------------

    def broker_of(self, node_id: int) -> str:
        """Service name of the broker with `node_id`."""
        name = broker_name(node_id)
        if name not in self.brokers:
            raise InvalidArgument(f"no broker with node id {node_id}")
        return name

    def _partition(self, topic: str, partition: int, timeout: float) -> tuple[int, list[int]]:
        """(leader, isr) of `topic`/`partition` from the brokers' metadata."""
        try:
            md = admin_client(self.kafka_bootstrap, timeout).list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise ServiceError(f"kafka metadata for {topic}: {exc}") from exc
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None or partition not in meta.partitions:
            reason = meta.error if meta is not None else "missing"
            raise ServiceError(f"kafka metadata for {topic}/{partition}: {reason}")
        part = meta.partitions[partition]
        return int(part.leader), [int(n) for n in part.isrs]

    def partition_leader(self, topic: str, partition: int = 0, timeout: float = 30.0) -> int:
        """Node id of the partition's leader, waiting up to `timeout` while none is elected."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                leader, _ = self._partition(topic, partition, timeout=5.0)
                if leader >= 0:
                    return leader
                problem = "no leader"
            except ServiceError as exc:
                problem = exc.message
            if time.monotonic() >= deadline:
                raise ServiceError(f"{topic}/{partition}: {problem} after {timeout:.0f}s")
            time.sleep(0.5)

    def partition_isr(self, topic: str, partition: int = 0) -> list[int]:
        """Node ids in the partition's in-sync replica set, as the metadata reports it."""
        return sorted(self._partition(topic, partition, timeout=5.0)[1])

    def etcd_leader(self, timeout: float = 30.0) -> str:
        """Member name of the etcd leader: the one a running member names, once that
        leader itself runs (right after a leader dies, members still name it until
        they elect another)."""
        deadline = time.monotonic() + timeout
        while True:
            for member in self._etcd:
                if not self._running(member):
                    continue
                name = member.leader_name(timeout=2.0)
                if name is not None and self._running(self.service(name)):
                    return name
            if time.monotonic() >= deadline:
                raise ServiceError(f"no running etcd member led within {timeout:.0f}s")
            time.sleep(0.2)

    @staticmethod
    def _running(svc: Service) -> bool:
        pid = svc.pid()
        return pid is not None and not process_stopped(pid)

    # --- health -------------------------------------------------------------------------

    def status(self) -> list[ServiceStatus]:
        """Each service's pid and health."""
        return [
            ServiceStatus(svc.name, svc.endpoint, svc.pid(), svc.listening() and svc.healthy())
            for svc in self._services.values()
        ]

    def healthy(self) -> bool:
        """Every broker is in the metadata and every etcd member answers."""
        registered = registered_brokers(self.kafka_bootstrap)
        return all(b.node_id in registered for b in self._brokers) and all(
            m.listening() and m.healthy() for m in self._etcd
        )

    @property
    def _brokers(self) -> list[KafkaBroker]:
        return [s for s in self._kafka if isinstance(s, KafkaBroker)]

    def down(self) -> list[str]:
        """Stop every process this state dir started: brokers, controller, etcd members."""
        stopped: list[str] = []
        groups: list[list[Service]] = [
            list(self._brokers),
            [self.service(CONTROLLER_NAME)],
            list(self._etcd),
        ]
        with self._lock():
            for group in groups:
                for svc in group:
                    pid = svc.pid()
                    if pid is not None:
                        os.kill(pid, signal.SIGCONT)

                def stop(svc: Service) -> None:
                    if svc.stop():
                        stopped.append(svc.name)

                _parallel(stop, group)
        return stopped


def cluster_up(cfg: StackConfig | None = None) -> Cluster:
    """Make the cluster healthy, installing and starting what is missing (idempotent)."""
    cfg = cfg or StackConfig.from_env()
    cluster = Cluster(cfg)
    # The jars are the single-node Kafka's: installed under the stack's own lock.
    with _state_lock(cfg):
        Kafka(cfg).install_jars()
    started = time.monotonic()
    cluster.start(*cluster.names)
    logger.info("cluster healthy after %.1fs", time.monotonic() - started)
    return cluster


def cluster_running(cfg: StackConfig) -> bool:
    """Some process of this state dir's cluster runs."""
    cluster = Cluster(cfg)
    return any(cluster.pid(name) is not None for name in cluster.names)
