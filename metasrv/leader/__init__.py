"""Being the leader: the explicit Follower -> Elected -> Leader state machine whose hooks start
and drop the leader's work (`Leadership`, `_lifecycle.py`), and the leader's view of the
regions, dropped at every leadership change (DESIGN §2 invariant 3; `LeaderView`): the
topic-region map, the region stat table and its registry, heartbeat judging and ingest, the
instruction mailbox, checkpoint batching and the per-topic locks; the term (`Term`) that
says when a new term's first round is in.

How a heartbeat's region stats flow, module by module:

- `_heartbeat.py`: `HeartbeatHandler` decodes a body (`metasrv.wire`), has it judged,
  stores what was accepted, marks changed checkpoints, answers.
- `_judge.py`: `HeartbeatJudge`, every report rule, a column at a time for both
  encodings: against the stored row, or against the map (`by_route`); `Judged` is the
  outcome, which stores itself.
- `_region_stats.py`: the rows. `RowColumns`' fields declare the stored columns once
  (`SCHEMA`); `StatTable` keeps them by slot (slots never leave this module and the
  judge), `TopicRows`/`TopicCopy` read one topic live or copied, `regressed` is the
  stat-regression rule.
- `_registry.py`: `RegionRegistry`, the table plus each topic's reported stats; what the
  rest of the product reads (`get`, `topic_snapshot`, `checkpoints`).
- `_checkpoints.py`: `Checkpointer`, the set of regions whose checkpoint changed and the
  writer that persists them.
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
