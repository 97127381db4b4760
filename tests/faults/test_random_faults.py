"""Random sequences of writes, flushes, heartbeats, purges and crashes (hypothesis stateful).

Each example drives the module's live cluster (three daemons, three datanodes writing
all along, on three Kafka brokers at RF 3 and a 3-member etcd) through a random sequence
of steps, among them SIGKILL or SIGSTOP of one broker (whichever leads or follows the WAL
partitions) and SIGKILL of one etcd member, at most one broker and one member down at a
time (the loss production must survive), each restarted by a later step or at the end.
After every step the monitor's invariant sample must find nothing deleted that a region
still needs and no marker moving backwards. Each example ends with the cluster healed,
every procedure a crash interrupted finished by a later leader, purging working again,
and a full recovery check. Shrinking is off: every step costs real process work, so a
failure is reported with its steps as run.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import httpx
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from metasrv.errors import MetasrvError
from metasrv.wire import MetasrvClient
from tests.faults._budget import FaultBudget
from tests.faults._cluster import FaultCluster, RecoveryResult
from tests.faults._services import FaultServices

pytestmark = pytest.mark.faults

NODES = st.integers(min_value=0, max_value=2)
MEMBERS = st.integers(min_value=1, max_value=3)
BROKER_PAUSE = 4.0
"""Seconds a SIGSTOPped broker stays stopped (less than Kafka's 9 s session timeout: the
partition leader keeps waiting for it, it is not fenced)."""


class RandomFaults(RuleBasedStateMachine):
    """Steps against `RandomFaults.cluster` (set by the test before running)."""

    cluster: ClassVar[FaultCluster]
    services: ClassVar[FaultServices]

    def __init__(self) -> None:
        super().__init__()
        self.down_broker: str | None = None
        self.down_member: str | None = None
        self.interrupted: list[str] = []
        self.result = RecoveryResult()
        self.steps: list[str] = []

    @property
    def all_daemons_up(self) -> bool:
        return all(d.alive and not d.paused for d in self.cluster.daemons)

    # --- load ---------------------------------------------------------------------------

    @rule(seconds=st.floats(min_value=0.2, max_value=1.5))
    def writes(self, seconds: float) -> None:
        self.steps.append("writes")
        self.cluster.run_for(seconds)

    @rule(node=NODES)
    def flush(self, node: int) -> None:
        self.steps.append("flush")
        datanode = self.cluster.workload.datanodes[node]
        if datanode.alive:
            datanode.flush()

    @rule(node=NODES)
    def heartbeat(self, node: int) -> None:
        self.steps.append("heartbeat")
        datanode = self.cluster.workload.datanodes[node]
        if datanode.alive:
            with contextlib.suppress(MetasrvError, httpx.HTTPError):
                datanode.heartbeat_once()

    @rule()
    def purge(self) -> None:
        self.steps.append("purge")
        leader, _ = self.cluster.wait_leader()
        with (
            MetasrvClient(leader.url, timeout=5) as client,
            contextlib.suppress(MetasrvError),
        ):
            client.purge()

    # --- crashes ------------------------------------------------------------------------

    @rule(node=NODES)
    def crash_datanode(self, node: int) -> None:
        self.steps.append("crash_datanode")
        self.cluster.summary.fault()
        self.cluster.recover_node(self.cluster.workload.datanodes[node], self.result)
        assert self.result.missing == 0 and not self.result.data_loss, self.result

    # No `precondition`s: they would read live cluster state, and hypothesis requires the
    # same draws when it replays an example; a step that does not apply does nothing.

    @rule()
    def crash_leader(self) -> None:
        self.steps.append("crash_leader")
        if not self.all_daemons_up:
            return
        old, interrupted = self.cluster.kill_leader()
        self.interrupted += interrupted
        self.cluster.wait_leader(exclude=old)

    @rule()
    def pause_leader(self) -> None:
        self.steps.append("pause_leader")
        if not self.all_daemons_up:
            return
        old, _ = self.cluster.wait_leader()
        old.pause()
        self.cluster.summary.fault()
        try:
            self.interrupted += sorted(self.cluster.unfinished())
            self.cluster.wait_leader(exclude=old)
        finally:
            old.resume()

    @rule()
    def restart_daemons(self) -> None:
        self.steps.append("restart_daemons")
        self.cluster.heal()

    # --- Kafka brokers and etcd members -------------------------------------------------

    @rule(broker=MEMBERS, kill=st.booleans())
    def broker_fault(self, broker: int, kill: bool) -> None:
        """SIGKILL one broker (kept down), or SIGSTOP it for `BROKER_PAUSE` seconds of load."""
        self.steps.append(f"{'kill' if kill else 'pause'}_broker_{broker}")
        if self.down_broker is not None:
            return
        name = f"kafka-broker-{broker}"
        self.cluster.summary.fault()
        if kill:
            self.services.kill(name)
            self.down_broker = name
            return
        self.services.pause(name)
        try:
            self.cluster.run_for(BROKER_PAUSE)
        finally:
            self.services.resume(name)

    @rule(member=MEMBERS)
    def kill_etcd_member(self, member: int) -> None:
        self.steps.append(f"kill_etcd_{member}")
        if self.down_member is not None:
            return
        name = f"etcd-{member}"
        self.services.kill(name)
        self.cluster.summary.fault()
        self.down_member = name

    @rule()
    def restart_services(self) -> None:
        self.steps.append("restart_services")
        self._restart_services()

    def _restart_services(self) -> None:
        for name in (self.down_broker, self.down_member):
            if name is not None:
                self.services.start(name)
        self.down_broker = self.down_member = None

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def nothing_needed_was_deleted(self) -> None:
        with contextlib.suppress(MetasrvError):
            found = self.cluster.monitor.sample()
            assert not found, found

    def teardown(self) -> None:
        print(f"random faults: {' '.join(self.steps)}")
        self._restart_services()
        self.cluster.heal()
        self.cluster.finish_resumed(sorted(set(self.interrupted)))
        # Every fault healed: purging works again before the recovery check.
        self.cluster.wait_purge_progress(dict(self.cluster.monitor.markers), timeout=180.0)
        self.cluster.assert_recovers()


def test_random_fault_sequences(
    cluster: FaultCluster, fault_services: FaultServices, budget: FaultBudget
) -> None:
    RandomFaults.cluster = cluster
    RandomFaults.services = fault_services
    run_state_machine_as_test(
        RandomFaults,
        settings=settings(
            max_examples=budget.examples,
            stateful_step_count=budget.steps,
            deadline=None,
            phases=(Phase.generate,),
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
