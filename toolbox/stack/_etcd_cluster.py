"""A 3-member etcd cluster (Debian's etcd), each member with its own data dir.

Member i (1..3) is `etcd-i` under `<state dir>/cluster/etcd-i/`, its client port
`cluster_etcd_ports[i-1]` and its peer port the client port + 1; every member's
`--initial-cluster` lists all three.
"""

from __future__ import annotations

from pathlib import Path

import pyetcd

from toolbox.stack._config import StackConfig
from toolbox.stack._etcd import etcd_env, require_etcd
from toolbox.stack._process import spawn
from toolbox.stack._service import Service

MEMBER_IDS = (1, 2, 3)

# pyetcd raises its own exceptions for protocol errors but lets grpc's through for
# connection trouble; both mean "not healthy" here.
_PROBE_ERRORS: tuple[type[BaseException], ...] = (Exception,)


def member_name(index: int) -> str:
    """Service name (and etcd member name) of member `index`."""
    return f"etcd-{index}"


class EtcdMember(Service):
    """Member `index` (1..3) of the cluster's etcd."""

    stop_grace = 15.0

    def __init__(self, cfg: StackConfig, index: int) -> None:
        self.index = index
        self.name = member_name(index)
        super().__init__(cfg)
        self.dir = cfg.cluster_dir / self.name
        self.pid_file = self.dir / f"{self.name}.pid"

    @property
    def port(self) -> int:
        return self.cfg.cluster_etcd_ports[self.index - 1]

    @property
    def peer_port(self) -> int:
        return self.port + 1

    @property
    def endpoint(self) -> str:
        return f"{self.cfg.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "etcd.log"

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def install(self) -> None:
        require_etcd()
        self.dir.mkdir(parents=True, exist_ok=True)

    def launch(self) -> None:
        c = self.cfg
        client = f"http://{self.endpoint}"
        peer = f"http://{c.host}:{self.peer_port}"
        initial = ",".join(
            f"{member_name(i)}=http://{c.host}:{c.cluster_etcd_ports[i - 1] + 1}"
            for i in MEMBER_IDS
        )
        argv = [
            "etcd",
            "--name",
            self.name,
            "--data-dir",
            str(self.data),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            # Read only on a member's first start (an existing data dir holds the membership).
            "--initial-cluster",
            initial,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "metasrv-stack-cluster",
            "--logger",
            "zap",
            "--log-level",
            "warn",
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "10000",
        ]
        spawn(argv, log_file=self.log_file, pid_file=self.pid_file, cwd=self.dir, env=etcd_env())

    def client(self, timeout: float = 5.0) -> pyetcd.Etcd3Client:
        """A client of this member only (close it)."""
        return pyetcd.client(self.cfg.host, self.port, timeout=timeout)

    def healthy(self, timeout: float = 5.0) -> bool:
        """A linearizable read through this member succeeds (it is connected to a quorum)."""
        client = self.client(timeout)
        try:
            client.get("/metasrv-stack-probe")
            return True
        except _PROBE_ERRORS:
            return False
        finally:
            client.close()

    def leader_name(self, timeout: float = 5.0) -> str | None:
        """The etcd leader's member name as this member sees it (None: no answer, no leader)."""
        client = self.client(timeout)
        try:
            leader = client.status().leader
        except _PROBE_ERRORS:
            return None
        finally:
            client.close()
        return None if leader is None else str(leader.name)


def etcd_members(cfg: StackConfig) -> list[EtcdMember]:
    """Members 1..3."""
    return [EtcdMember(cfg, i) for i in MEMBER_IDS]
