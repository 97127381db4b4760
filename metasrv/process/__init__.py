"""Process plumbing shared by every background loop:

- `_supervisor.py`: `Supervisor`, the one owner of a process's loops: starts them in order,
  reports a failed round and a dead loop, drains them in reverse order, repeat-safe;
- `_periodic.py`: `PeriodicLoop`, the one ticker every periodic loop runs on;
- `_backoff.py`: `Backoff`, the one capped exponential backoff every retry waits by;
- `_loop_lag.py`, `_gc_pacer.py`: two loops of the process itself, the event-loop lag probe
  and the paced garbage collector.
"""

from metasrv.process._backoff import Backoff, Jitter
from metasrv.process._gc_pacer import FULL_EVERY, MIDDLE_EVERY, GcPacer
from metasrv.process._loop_lag import LoopLagMonitor
from metasrv.process._periodic import PeriodicLoop
from metasrv.process._supervisor import (
    ErrorSink,
    Step,
    Supervised,
    Supervisor,
    log_only,
    nothing,
)

__all__ = [
    "FULL_EVERY",
    "MIDDLE_EVERY",
    "Backoff",
    "ErrorSink",
    "GcPacer",
    "Jitter",
    "LoopLagMonitor",
    "PeriodicLoop",
    "Step",
    "Supervised",
    "Supervisor",
    "log_only",
    "nothing",
]
