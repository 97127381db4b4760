"""The procedure framework (persisted steps, retries, resume) and the WAL purge procedure."""

from procedures._batcher import KafkaBatcher
from procedures._history import History, PurgeRecord, WalEvent
from procedures._manager import ProcedureManager, backoff_delay
from procedures._procedure import (
    TERMINAL_STATES,
    Finish,
    Next,
    Procedure,
    ProcedureRecord,
    ProcedureState,
    ProcedureView,
    StepContext,
    StepResult,
    StepRun,
)
from procedures._services import FlushMailbox, LeaderFence, Services, StatSource, TopicMap
from procedures._store import ProcedureStore, RecordConflict, state_key
from procedures.wal_purge import FlushTarget, PurgeData, PurgeStep, WalPurge

__all__ = [
    "TERMINAL_STATES",
    "Finish",
    "FlushMailbox",
    "FlushTarget",
    "History",
    "KafkaBatcher",
    "LeaderFence",
    "Next",
    "Procedure",
    "ProcedureManager",
    "ProcedureRecord",
    "ProcedureState",
    "ProcedureStore",
    "ProcedureView",
    "PurgeData",
    "PurgeRecord",
    "PurgeStep",
    "RecordConflict",
    "Services",
    "StatSource",
    "StepContext",
    "StepResult",
    "StepRun",
    "TopicMap",
    "WalEvent",
    "WalPurge",
    "backoff_delay",
    "state_key",
]
