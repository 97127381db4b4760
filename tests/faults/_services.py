"""The fault suite's own Kafka and etcd, which it may stop, pause and restart.

Other test sessions use the shared stack (Kafka 19092, etcd 12379) at the same time, so
the suite never touches it: it runs a second stack from the project's stack code in its
own state directory (`.stack-faults/` by default, `METASRV_FAULTS_STACK_DIR` to move it)
on other ports (Kafka 29092/29093, etcd 22379/22380).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from toolbox.stack import StackConfig, endpoints_of, service_pid, start_service, stop_service

STATE_DIR_ENV = "METASRV_FAULTS_STACK_DIR"
KAFKA_PORT = 29092
KAFKA_CONTROLLER_PORT = 29093
ETCD_PORT = 22379
ETCD_PEER_PORT = 22380
SERVICES = ("etcd", "kafka")


def fault_stack_config() -> StackConfig:
    """State dir and ports of the fault suite's stack."""
    root = Path(__file__).resolve().parents[2]
    state_dir = os.environ.get(STATE_DIR_ENV) or str(root / ".stack-faults")
    return StackConfig.from_env(
        state_dir=state_dir,
        kafka_port=KAFKA_PORT,
        kafka_controller_port=KAFKA_CONTROLLER_PORT,
        etcd_port=ETCD_PORT,
        etcd_peer_port=ETCD_PEER_PORT,
    )


class FaultServices:
    """Start, stop, pause and continue the suite's Kafka and etcd."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        endpoints = endpoints_of(cfg)
        self.kafka = endpoints.kafka_bootstrap
        self.etcd = endpoints.etcd_endpoint
        self.paused: set[str] = set()

    def start(self, name: str) -> None:
        """Start one service (idempotent); waits until it answers."""
        start_service(self.cfg, name)

    def stop(self, name: str) -> None:
        """Stop one service (SIGTERM, then SIGKILL)."""
        self.resume(name)
        stop_service(self.cfg, name)

    def pause(self, name: str) -> None:
        """SIGSTOP one service."""
        pid = service_pid(self.cfg, name)
        assert pid is not None, f"{name} is not running"
        os.kill(pid, signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        """SIGCONT one service if paused."""
        if name in self.paused:
            pid = service_pid(self.cfg, name)
            if pid is not None:
                os.kill(pid, signal.SIGCONT)
            self.paused.discard(name)

    def up(self) -> None:
        """Continue paused services and start stopped ones."""
        for name in SERVICES:
            self.resume(name)
            self.start(name)

    def down(self) -> None:
        """Stop both services."""
        for name in reversed(SERVICES):
            self.stop(name)
