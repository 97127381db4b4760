"""Process plumbing shared by every background loop: failure accounting, the event-loop lag
probe, the paced garbage collector and the lifecycle of a periodic loop.
"""

from metasrv.process._background import BackgroundTasks, ErrorSink, log_only
from metasrv.process._gc_pacer import FULL_EVERY, MIDDLE_EVERY, GcPacer
from metasrv.process._loop_lag import LoopLagMonitor
from metasrv.process._periodic import PeriodicLoop

__all__ = [
    "FULL_EVERY",
    "MIDDLE_EVERY",
    "BackgroundTasks",
    "ErrorSink",
    "GcPacer",
    "LoopLagMonitor",
    "PeriodicLoop",
    "log_only",
]
