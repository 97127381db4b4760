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
  encodings: the stored rows' word (a `Verdict`), or the map (`by_route`); `Judged` is
  the outcome, which stores itself through its verdict.
- `_region_stats.py`: the rows. `RowColumns`' fields declare the stored columns once
  (`SCHEMA`); `StatTable` keeps them by slot (a slot never leaves this module: callers
  give region ids or a heartbeat's columns), judges a heartbeat's columns against them
  (`Verdict`), `TopicRows`/`TopicCopy` read one topic live or copied, `DirtyRows` is the
  checkpointer's dirty set, `regressed` is the stat-regression rule.
- `_registry.py`: `RegionRegistry`, the table (private) plus each topic's reported stats;
  what the rest of the product reads (`get`, `topic_snapshot`, `row_slices`).
- `_checkpoints.py`: `Checkpointer`, owner of the dirty set, and the writer that persists
  it a batch of `region_id -> checkpoint` at a time.
"""

from metasrv.leader._checkpoints import Checkpointer
from metasrv.leader._follower import MapFollower
from metasrv.leader._heartbeat import HeartbeatHandler
from metasrv.leader._judge import HeartbeatJudge, Judged
from metasrv.leader._lifecycle import Leadership, Role
from metasrv.leader._locks import TopicLocks
from metasrv.leader._mailbox import FLUSH_REGIONS, InstructionState, Mailbox
from metasrv.leader._region_map import TopicRegionMap
from metasrv.leader._region_stats import (
    RowColumns,
    StatRow,
    TopicRows,
    columns_of_rows,
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
    "HeartbeatJudge",
    "InstructionState",
    "Judged",
    "LeaderView",
    "Leadership",
    "Mailbox",
    "MapFollower",
    "RegionRegistry",
    "Role",
    "RowColumns",
    "StatRow",
    "Term",
    "TopicLocks",
    "TopicRegionMap",
    "TopicRows",
    "columns_of_rows",
    "regresses",
    "row_of",
]
