"""The leader's view of the regions, dropped at every leadership change (DESIGN §2 invariant 3):
the topic-region map, the region stat table and its registry, heartbeat judging and ingest,
the instruction mailbox, checkpoint batching and the per-topic locks.
"""

from metasrv.leader._checkpoints import Checkpointer
from metasrv.leader._heartbeat import HeartbeatHandler
from metasrv.leader._locks import TopicLocks
from metasrv.leader._mailbox import FLUSH_REGIONS, InstructionState, Mailbox
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._registry import RegionRegistry, StatRow, StatSnapshot, row_of
from metasrv.leader._stat_table import NULL, RowColumns, StatTable, TopicRows

__all__ = [
    "FLUSH_REGIONS",
    "NULL",
    "Checkpointer",
    "HeartbeatHandler",
    "InstructionState",
    "Mailbox",
    "RegionRegistry",
    "RowColumns",
    "StatRow",
    "StatSnapshot",
    "StatTable",
    "TopicLocks",
    "TopicRegionMap",
    "TopicRows",
    "row_of",
]
