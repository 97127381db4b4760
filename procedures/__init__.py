"""The procedure framework: persisted steps, retries, cancellation, resume on a new leader.

It knows no procedure kind; the runtime registers them (today the one in
`procedures.wal_purge`).
"""

from metasrv.wire import TERMINAL_STATES, ProcedureState
from procedures._events import EventLog, EventRetention
from procedures._group_commit import GroupCommitter, MicroBatcher, Pending
from procedures._history import History
from procedures._leader import LeaderFence
from procedures._manager import ProcedureManager
from procedures._procedure import (
    Finish,
    Next,
    Procedure,
    ProcedureRecord,
    ProcedureView,
    StepContext,
    StepResult,
    StepRun,
)
from procedures._runner import ProcedureRun
from procedures._store import ProcedureStore, RecordConflict, state_key

__all__ = [
    "TERMINAL_STATES",
    "EventLog",
    "EventRetention",
    "Finish",
    "GroupCommitter",
    "History",
    "LeaderFence",
    "MicroBatcher",
    "Next",
    "Pending",
    "Procedure",
    "ProcedureManager",
    "ProcedureRecord",
    "ProcedureRun",
    "ProcedureState",
    "ProcedureStore",
    "ProcedureView",
    "RecordConflict",
    "StepContext",
    "StepResult",
    "StepRun",
    "state_key",
]
