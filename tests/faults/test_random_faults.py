"""Random sequences of writes, flushes, heartbeats, purges and crashes (hypothesis stateful).

Each example drives the module's live cluster (three daemons, three datanodes writing
all along) through a random sequence of steps; after every step the monitor's invariant
sample must find nothing deleted that a region still needs and no marker moving
backwards. Each example ends with the cluster healed, every procedure a crash
interrupted finished by a later leader, and a full recovery check. Shrinking is off:
every step costs real process work, so a failure is reported with its steps as run.
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

from metasrv.client import MetasrvClient
from metasrv.errors import MetasrvError
from tests.faults._budget import FaultBudget
from tests.faults._cluster import FaultCluster, RecoveryResult

pytestmark = pytest.mark.faults

NODES = st.integers(min_value=0, max_value=2)


class RandomFaults(RuleBasedStateMachine):
    """Steps against `RandomFaults.cluster` (set by the test before running)."""

    cluster: ClassVar[FaultCluster]

    def __init__(self) -> None:
        super().__init__()
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

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def nothing_needed_was_deleted(self) -> None:
        with contextlib.suppress(MetasrvError):
            found = self.cluster.monitor.sample()
            assert not found, found

    def teardown(self) -> None:
        print(f"random faults: {' '.join(self.steps)}")
        self.cluster.heal()
        self.cluster.finish_resumed(sorted(set(self.interrupted)))
        self.cluster.assert_recovers()


def test_random_fault_sequences(cluster: FaultCluster, budget: FaultBudget) -> None:
    RandomFaults.cluster = cluster
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
