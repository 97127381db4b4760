"""Process plumbing shared by every background loop: failure accounting, the event-loop lag
probe and the paced garbage collector.
"""

from metasrv.process._background import BackgroundTasks, ErrorSink, log_only
from metasrv.process._gc_pacer import FULL_EVERY, MIDDLE_EVERY, GcPacer
from metasrv.process._loop_lag import LoopLagMonitor

__all__ = [
    "FULL_EVERY",
    "MIDDLE_EVERY",
    "BackgroundTasks",
    "ErrorSink",
    "GcPacer",
    "LoopLagMonitor",
    "log_only",
]
