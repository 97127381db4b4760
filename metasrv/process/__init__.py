"""Process plumbing shared by every background loop: failure accounting, the event-loop lag
probe, the paced garbage collector, the lifecycle of a periodic loop and the one backoff
every retry waits by.
"""

from metasrv.process._background import BackgroundTasks, ErrorSink, log_only
from metasrv.process._backoff import Backoff, Jitter
from metasrv.process._gc_pacer import FULL_EVERY, MIDDLE_EVERY, GcPacer
from metasrv.process._loop_lag import LoopLagMonitor
from metasrv.process._periodic import PeriodicLoop

__all__ = [
    "FULL_EVERY",
    "MIDDLE_EVERY",
    "BackgroundTasks",
    "Backoff",
    "ErrorSink",
    "GcPacer",
    "Jitter",
    "LoopLagMonitor",
    "PeriodicLoop",
    "log_only",
]
