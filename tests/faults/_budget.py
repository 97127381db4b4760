"""How long and how often the fault suite works: the bounded default and the long run."""

from __future__ import annotations

import os
from dataclasses import dataclass

LONG_ENV = "METASRV_FAULTS_LONG"
"""Set to 1 (or pass `--run-slow`) for the long run."""


@dataclass(frozen=True)
class FaultBudget:
    """Durations and counts of one fault-suite run."""

    long: bool
    """True for the long run."""
    kafka_outage: float
    """Seconds the broker stays down before it is started again."""
    etcd_pause: float
    """Seconds etcd stays SIGSTOPped (longer than the election lease)."""
    settle: float
    """Seconds of load after a fault is healed, before the recovery check."""
    rounds: int
    """Times each scripted fault is injected in one test."""
    examples: int
    """Hypothesis examples of the random fault sequence."""
    steps: int
    """Steps per hypothesis example."""
    test_timeout: float
    """Per-test timeout in seconds."""

    @classmethod
    def choose(cls, *, run_slow: bool) -> FaultBudget:
        """The long budget with `--run-slow` or `METASRV_FAULTS_LONG=1`, else the bounded one."""
        if run_slow or os.environ.get(LONG_ENV, "") not in ("", "0"):
            return cls(
                long=True,
                kafka_outage=30.0,
                etcd_pause=10.0,
                settle=10.0,
                rounds=3,
                examples=8,
                steps=15,
                test_timeout=1800.0,
            )
        return cls(
            long=False,
            kafka_outage=4.0,
            etcd_pause=6.0,
            settle=3.0,
            rounds=1,
            examples=3,
            steps=8,
            test_timeout=280.0,
        )
