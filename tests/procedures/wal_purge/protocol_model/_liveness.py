"""Liveness over the explored graph: from every reachable state, once writes stop, every
write in flight has landed and every region has flushed and reported the truth, the
current leader runs the topic's purge to its end and a new one can start and end too
(no orphaned record holding the topic's lock, no route of a region that no longer
exists blocking the topic).

`settle` walks one deterministic path of quiet transitions from a state (the model's own
transitions: landings first, then the purge's steps) and returns what got stuck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.procedures.wal_purge.protocol_model._product import accepts, region_id
from tests.procedures.wal_purge.protocol_model._world import (
    ABSENT,
    ERROR,
    LIVE,
    Record,
    State,
    Task,
)

if TYPE_CHECKING:
    from tests.procedures.wal_purge.protocol_model._actions import Model

STEP_LIMIT = 40

Tail = list[tuple[str, State]]


def _land_all(model: Model, s: State, tail: Tail) -> State:
    while s.pending:
        label, s, _bad = next(model._landings(s))
        tail.append((label, s))
    return s


def _run(model: Model, s: State, tail: Tail) -> State | None:
    """Run the current task to its end; None when it does not end."""
    for _ in range(STEP_LIMIT):
        s = _land_all(model, s, tail)
        if s.task is None:
            return s
        moves = list(model._task_moves(s))
        if not moves:
            return None
        label, s, _bad = moves[0]
        tail.append((label, s))
    return None


def _quiesce_regions(model: Model, s: State, tail: Tail) -> State:
    regions = list(s.regions)
    stats = list(s.stats)
    for i, region in enumerate(regions):
        if region.phase != LIVE:
            continue
        if region.replay is not None:
            start = region.replay if region.replay != ERROR else model._answer(s, i)
            if start == ERROR or start < s.kafka.log_start:
                continue  # cannot open: WAL data loss, reported elsewhere
            kept = tuple(e for e in region.lost if e[0] == s.kafka.inc and e[1] >= start)
            region = region._replace(replay=None, lost=(), mem=kept)
        if region.mem:
            region = region._replace(mem=(), flushed=region.mem[-1][1])
        regions[i] = region
        if s.lmap[i] != ABSENT and accepts(stats[i], region.flushed):
            stats[i] = (region.flushed, region.claim)
    s = s._replace(regions=tuple(regions), stats=tuple(stats))
    tail.append(("every region flushes and reports", s))
    return s


def settle(model: Model, s: State) -> tuple[str, Tail] | None:
    """None when `s` settles; else what is stuck and the path that shows it."""
    tail: Tail = []
    s = _land_all(model, s, tail)
    s = _quiesce_regions(model, s, tail)
    ended = _run(model, s, tail)
    if ended is None:
        return "the purge in progress never ends", tail
    s = ended
    if s.record is not None:
        return "a non-terminal procedure record that no task runs holds the topic's lock", tail
    plan = model.product.plan(s.lmap, s.stats, s.marker, s.kafka, s.pinned)
    ghosts = [b.region_id for b in plan.blocked_by if s.regions[b.region_id - 1].phase != LIVE]
    if ghosts:
        return f"the topic is blocked by regions {ghosts} that no longer exist", tail
    s = s._replace(record=Record("prepare", None, None), task=Task("prepare"))
    tail.append(("purge submitted", s))
    if _run(model, s, tail) is None:
        return "a new purge never ends", tail
    _ = region_id
    return None
