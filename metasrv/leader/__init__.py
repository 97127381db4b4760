"""Being the leader: the explicit Follower -> Elected -> Leader state machine whose hooks start
and drop the leader's work (`Leadership`, `_lifecycle.py`), and the leader's view of the
regions, dropped at every leadership change (DESIGN §2 invariant 3; `LeaderView`): the
topic-region map, the region stat table and its registry, heartbeat judging and ingest, the
instruction mailbox, checkpoint batching and the per-topic locks; the term (`Term`) that
says when a new term's first round is in.
"""

from metasrv.leader._checkpoints import Checkpointer
from metasrv.leader._follower import MapFollower
from metasrv.leader._heartbeat import HeartbeatHandler
from metasrv.leader._lifecycle import Leadership, Role
from metasrv.leader._locks import TopicLocks
from metasrv.leader._mailbox import FLUSH_REGIONS, InstructionState, Mailbox
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._region_stats import (
    RowColumns,
    RowValues,
    StatRow,
    StatTable,
    TopicRows,
    regresses,
)
from metasrv.leader._registry import RegionRegistry, row_of
from metasrv.leader._term import FIRST_ROUND_CHECK, Term
from metasrv.leader._view import LeaderView
from metasrv.model import NULL

__all__ = [
    "FIRST_ROUND_CHECK",
    "FLUSH_REGIONS",
    "NULL",
    "Checkpointer",
    "HeartbeatHandler",
    "InstructionState",
    "LeaderView",
    "Leadership",
    "Mailbox",
    "MapFollower",
    "RegionRegistry",
    "Role",
    "RowColumns",
    "RowValues",
    "StatRow",
    "StatTable",
    "Term",
    "TopicLocks",
    "TopicRegionMap",
    "TopicRows",
    "regresses",
    "row_of",
]
