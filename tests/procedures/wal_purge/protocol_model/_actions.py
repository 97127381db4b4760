"""Every transition of the model and the safety invariants checked on each.

The purge's steps follow procedures/wal_purge/_procedure.py (prepare -> flush -> purge,
marker CAS then DeleteRecords, the purge step re-planning while the marker is below the
target), and every decision in them is the product's: the plan (`plan_topic`), whether
it leaves anything to cut (`nothing_to_cut`), the flush candidates (`flush_candidates`),
replay-start (`replay_start_entry_id`), the heartbeat judge's regression rule
(`regresses`) and the marker codec (`decode_marker`/`encode_marker`). What the model
decides itself is only the world: who writes when, what arrives late, what Kafka does.

A transition is (label, next state, violation or None).
"""

from __future__ import annotations

from collections.abc import Iterator

from metasrv.errors import TopicReset
from procedures.wal_purge import Advance, CatchUp, Cut, Flush, Lost, Reset, Skip, Wait
from tests.procedures.wal_purge.protocol_model._product import (
    Product,
    accepts,
    region_id,
    stat_prunable,
)
from tests.procedures.wal_purge.protocol_model._world import (
    ABSENT,
    ERROR,
    FOREIGN,
    GONE,
    LIVE,
    NEW,
    Bounds,
    Kafka,
    Record,
    Region,
    State,
    Task,
    Variant,
    registered,
)

Transition = tuple[str, State, str | None]


def _put(items: tuple[object, ...], index: int, value: object) -> tuple[object, ...]:
    return (*items[:index], value, *items[index + 1 :])


def _regions(s: State, i: int, region: Region) -> State:
    return s._replace(regions=_put(s.regions, i, region))  # type: ignore[arg-type]


def _finish(s: State) -> State:
    """The run ends (succeeded, skipped or failed): the record is terminal, the lock free."""
    return s._replace(record=None, task=None)


def _stale(pending: frozenset[tuple[object, ...]]) -> frozenset[tuple[object, ...]]:
    """The marker's revision moved: every marker CAS in flight now fails its compare."""
    return frozenset((o[0], o[1], False, *o[3:]) if o[0] == "cas" else o for o in pending)


def needs(s: State, i: int) -> tuple[tuple[int, int], ...]:
    """The entries region `i` still needs from the WAL: its unflushed ones."""
    region = s.regions[i]
    if region.phase != LIVE:
        return ()
    return region.mem + region.lost


def _lost_outside(s: State, i: int) -> bool:
    """Region `i` needs an entry Kafka no longer holds (outside WAL data loss)."""
    kafka = s.kafka
    return any(inc != kafka.inc or off < kafka.log_start for inc, off in needs(s, i))


def check_replay_start(s: State, i: int, start: int, own: int, when: str) -> str | None:
    """A replay start never skips an entry the region has not flushed, unless it is the
    region's own claim (`own` + 1: after a topic recreation a region's flushed id may
    name offsets of the old topic, which only the region could know); and it is below
    Kafka's log start only where something else than metasrv deleted (retention, a
    recreation) or the region needs entries that are gone (data loss, reported)."""
    kafka = s.kafka
    first = min((off for inc, off in needs(s, i) if inc == kafka.inc), default=None)
    if first is not None and start > first and start > own + 1:
        return (
            f"replay skips an entry: {when}: replay-start {start} for region {region_id(i)} "
            f"skips its unflushed entry {first} (topic incarnation {kafka.inc})"
        )
    if start < kafka.purged and start < kafka.log_start and not _lost_outside(s, i):
        return (
            f"replay below the log start: {when}: replay-start {start} for region "
            f"{region_id(i)} is below Kafka's log start {kafka.log_start} (metasrv deleted "
            f"below {kafka.purged}) although it needs nothing below it"
        )
    return None


class Model:
    """The transitions of one world (bounds) under one protocol (variant)."""

    def __init__(self, bounds: Bounds, variant: Variant = Variant.NONE) -> None:
        self.bounds = bounds
        self.variant = variant
        self.product = Product(variant)

    # -- the purge's steps (the current leader's run of the record) --------------------

    def _shared(self, s: State, decision: object, step: str) -> Transition:
        """What every step does with Reset, Lost and Skip: fail or finish."""
        if isinstance(decision, Reset):
            value = self.product.latched(s.marker, decision)
            state = _finish(
                s if value is None else s._replace(marker=value, pending=_stale(s.pending))
            )
            return (
                f"{step}: topic reset ({decision.reason.split(':')[0]}) latched: failed",
                state,
                None,
            )
        if isinstance(decision, Lost):
            return (f"{step}: WAL data loss {list(decision.regions)}: failed", _finish(s), None)
        assert isinstance(decision, Skip), decision
        return (f"{step}: skipped ({decision.reason.split(':')[0]})", _finish(s), None)

    def _delete_below(self, s: State, target: int, log_start: int, inc: int) -> Transition:
        """`delete_below` with the log start the step read (of incarnation `inc`)."""
        if log_start >= target:
            return (f"log start {log_start} >= {target}: succeeded", _finish(s), None)
        op = ("del", s.term, target, inc, s.pinned)
        state = s._replace(task=Task("deleting", target), pending=s.pending | {op})
        return (f"DeleteRecords({target}) sent", state, None)

    def _marker_write(self, s: State, target: int, log_start: int) -> Transition:
        """`advance_marker` (fenced CAS), then `delete_below`."""
        try:
            value = self.product.advanced(s.marker, target, s.kafka)
        except TopicReset:
            return ("advance_marker: topic reset: failed", _finish(s), None)
        if value is None:
            return self._delete_below(s, target, log_start, s.kafka.inc)
        if Variant.DELETE_BEFORE_MARKER in self.variant:
            op: tuple[object, ...] = ("del", s.term, target, s.kafka.inc, s.pinned)
            task = Task("deleting_first", target)
            return (
                f"DeleteRecords({target}) sent first",
                s._replace(task=task, pending=s.pending | {op}),
                None,
            )
        op = ("cas", s.term, True, value, target)
        task = Task("cas", target, log_start, s.kafka.inc)
        return (
            f"marker CAS to {target} sent",
            s._replace(task=task, pending=s.pending | {op}),
            None,
        )

    def _prepare(self, s: State) -> Transition:
        assert s.record is not None
        plan, decision = self.product.prepare(s.lmap, s.stats, s.marker, s.kafka, s.pinned)
        if isinstance(decision, Flush | Cut):
            step = "flush" if isinstance(decision, Flush) else "purge"
            record = s.record._replace(
                step=step, prune_point=decision.prune_point, topic_id=plan.topic_id
            )
            return (
                f"prepare: P={plan.prune_point}, next {step}",
                s._replace(record=record, task=Task(step)),
                None,
            )
        return self._shared(s, decision, "prepare")

    def _after_flush(self, s: State) -> Transition:
        assert s.record is not None
        plan, decision = self.product.after_flush(
            s.record.topic_id, s.lmap, s.stats, s.marker, s.kafka, s.pinned
        )
        if isinstance(decision, Cut):
            record = s.record._replace(step="purge", prune_point=decision.prune_point)
            return (
                f"flush wait over: P={plan.prune_point}, next purge",
                s._replace(record=record, task=Task("purge")),
                None,
            )
        return self._shared(s, decision, "flush wait over")

    def _purge_step(self, s: State) -> Iterator[Transition]:
        record = s.record
        assert record is not None
        target = record.target
        if target is None:
            assert record.prune_point is not None
            target = record.prune_point
            record = record._replace(target=target)
            s = s._replace(record=record)
        _plan, decision = self.product.purge(
            target, record.topic_id, s.lmap, s.stats, s.marker, s.kafka, s.pinned
        )
        if isinstance(decision, Wait):
            # Unavailable: retried later; when the retries run out the procedure fails.
            yield ("purge: blocked; retries exhausted: failed", _finish(s), None)
            return
        if isinstance(decision, Skip):
            yield ("purge: skipped (nothing left)", _finish(s), None)
            return
        if isinstance(decision, Reset | Lost):
            yield self._shared(s, decision, "purge")
            return
        assert isinstance(decision, Advance | CatchUp), decision
        if self.bounds.archive:
            # `check_archived`: after the step's reads and decision, before anything moves.
            kafka = s.kafka
            blocked = self.product.not_archived(decision.target, kafka.log_start, kafka.archived)
            if blocked is not None:
                yield (f"purge: skipped (not_archived {blocked.gap})", _finish(s), None)
                return
        if isinstance(decision, Advance):
            if decision.lowered:
                s = s._replace(
                    record=record._replace(target=decision.target, prune_point=decision.target)
                )
            label, state, bad = self._marker_write(s, decision.target, s.kafka.log_start)
            yield (f"purge: advance to {decision.target}; {label}", state, bad)
            return
        label, state, bad = self._delete_below(s, decision.target, s.kafka.log_start, s.kafka.inc)
        yield (f"purge: catch up to {decision.target}; {label}", state, bad)

    def _task_moves(self, s: State) -> Iterator[Transition]:
        task = s.task
        if task is None:
            return
        if task.phase == "prepare":
            yield self._prepare(s)
        elif task.phase == "flush":
            yield self._after_flush(s)
        elif task.phase == "purge":
            yield from self._purge_step(s)
        elif task.phase in ("deleting", "deleting_first"):
            assert task.target is not None
            if s.kafka.log_start < task.target:
                yield (
                    "purge: DeleteRecords timed out: step retried",
                    s._replace(task=Task("purge")),
                    None,
                )
            elif task.phase == "deleting":
                yield ("purge: log start past the target: succeeded", _finish(s), None)
            else:
                value = self.product.advanced(s.marker, task.target, s.kafka)
                if value is None:
                    yield ("purge: deleted, marker there already: succeeded", _finish(s), None)
                    return
                op = ("cas", s.term, True, value, task.target)
                state = s._replace(
                    task=Task("cas", task.target, 1 << 30, s.kafka.inc), pending=s.pending | {op}
                )
                yield (f"purge: deleted; marker CAS to {task.target} sent", state, None)

    # -- writes landing ----------------------------------------------------------------

    def _landings(self, s: State) -> Iterator[Transition]:
        for op in sorted(s.pending, key=repr):
            rest = s.pending - {op}
            kind, term = op[0], op[1]
            assert isinstance(term, int)
            if kind == "cas":
                _, _, valid, value, target = op
                assert isinstance(target, int) and isinstance(value, bytes)
                ok = term == s.term and valid is True
                state = s._replace(pending=rest)
                if ok:
                    state = state._replace(marker=value, pending=_stale(rest))
                task = s.task
                waiting = (
                    task is not None
                    and task.phase == "cas"
                    and task.target == target
                    and term == s.term
                )
                label = f"marker CAS to {target} of term {term} {'lands' if ok else 'fenced'}"
                if waiting and task is not None:
                    if ok:
                        assert task.log_start is not None and task.inc is not None
                        sub, state, bad = self._delete_below(
                            state, target, task.log_start, task.inc
                        )
                        yield (f"{label}; {sub}", state, bad)
                        continue
                    state = state._replace(task=Task("purge"))
                yield (label, state, None)
            elif kind == "route":
                _, _, i, checkpoint = op
                assert isinstance(i, int)
                fenced = Variant.UNFENCED_CHECKPOINT not in self.variant
                ok = term == s.term or not fenced
                state = s._replace(pending=rest)
                bad = None
                if ok:
                    state = state._replace(routes=_put(s.routes, i, checkpoint))  # type: ignore[arg-type]
                    if term < s.term:
                        bad = (
                            f"deposed write landed: a checkpoint write of deposed term {term} "
                            f"landed in term {s.term}"
                        )
                yield (
                    f"checkpoint {checkpoint} of region {region_id(i)} (term {term}) "
                    f"{'lands' if ok else 'fenced'}",
                    state,
                    bad,
                )
            elif kind == "del":
                _, _, offset, inc, pinned = op
                assert isinstance(offset, int)
                if inc == s.kafka.inc or self.bounds.late_delete_across_reset:
                    yield from self._delete_lands(
                        s._replace(pending=rest), term, offset, pinned=pinned is True
                    )
                yield (
                    f"DeleteRecords({offset}) of term {term} lost",
                    s._replace(pending=rest),
                    None,
                )

    def _delete_lands(
        self, s: State, term: int, offset: int, *, pinned: bool
    ) -> Iterator[Transition]:
        kafka = s.kafka
        label = f"DeleteRecords({offset}) of term {term} applied"
        if offset > kafka.hwm:
            yield (label + ": out of range, nothing deleted", s, None)
            return
        new_start = max(kafka.log_start, offset)
        bad = None
        committed = kafka.committed
        if pinned and new_start > kafka.log_start and (committed is None or new_start > committed):
            # The group reads `committed` next (from the log start when it has none).
            bad = (
                f"pinned entry deleted: {label}: the log start moved to {new_start} past the "
                f"pinned consumer group's committed offset {committed}"
            )
        if self.bounds.archive and bad is None:
            unarchived = [
                off for off in range(kafka.log_start, new_start) if not kafka.archived >> off & 1
            ]
            if unarchived:
                bad = (
                    f"unarchived entry deleted: {label}: entries {unarchived} are in no object "
                    "of the WAL archive"
                )
        for i in range(len(s.regions)):
            gone = [
                off
                for inc, off in needs(s, i)
                if inc == kafka.inc and kafka.log_start <= off < new_start
            ]
            if gone and bad is None:
                bad = (
                    f"needed entry deleted: {label}: deleted entries {gone} region "
                    f"{region_id(i)} still needs"
                )
                break
        purged = max(kafka.purged, offset) if offset > kafka.log_start else kafka.purged
        moved = kafka._replace(log_start=new_start, purged=purged)
        yield (label, s._replace(kafka=moved), bad)

    # -- the leader ---------------------------------------------------------------------

    def _route_busy(self, s: State, i: int) -> bool:
        """A checkpoint of region `i` from this term is in flight (its writes are
        serialised by the map's mutex)."""
        return any(op[0] == "route" and op[1] == s.term and op[2] == i for op in s.pending)

    def _leader_changes(self, s: State) -> Iterator[Transition]:
        """A new term: stats dropped, the map loaded from the kv, the record resumed."""
        task = Task(s.record.step) if s.record is not None else None
        base = s._replace(term=s.term + 1, stats=(None,) * len(s.stats), task=task)
        yield (
            f"leader change to term {s.term + 1} (map loaded from kv)",
            base._replace(lmap=s.routes),
            None,
        )
        if self.bounds.pin_later and not s.pinned:
            yield (
                f"leader change to term {s.term + 1}, its settings pin the consumer group",
                base._replace(lmap=s.routes, pinned=True),
                None,
            )
        if Variant.STALE_MAP_AT_TAKEOVER in self.variant:
            for i, route in enumerate(s.routes):
                if route != ABSENT:
                    lmap = _put(s.routes, i, ABSENT)
                    label = (
                        f"leader change to term {s.term + 1}, its map missing region {region_id(i)}"
                    )
                    yield (label, base._replace(lmap=lmap), None)  # type: ignore[arg-type]

    def _leader_moves(self, s: State) -> Iterator[Transition]:
        b = self.bounds
        if s.term < b.max_terms:
            yield from self._leader_changes(s)
        if s.record is None and s.task is None:
            record = Record("prepare", None, None)
            yield ("purge submitted", s._replace(record=record, task=Task("prepare")), None)
            if Variant.ORPHAN_ON_UNKNOWN_CREATE in self.variant:
                yield (
                    "purge submitted, create outcome unknown: record orphaned",
                    s._replace(record=record),
                    None,
                )
        for i, region in enumerate(s.regions):
            if s.lmap[i] == ABSENT or self._route_busy(s, i):
                continue
            stat = s.stats[i]
            if b.checkpoints and stat is not None:
                value = stat_prunable(stat)
                if value != s.lmap[i]:
                    # Within a term the map's mutex orders a region's route writes, and a
                    # fenced write of a deposed term never lands: only a write caught in
                    # flight by a leader change (and not fenced) makes a state of its own.
                    state = s._replace(
                        lmap=_put(s.lmap, i, value),  # type: ignore[arg-type]
                        routes=_put(s.routes, i, value),  # type: ignore[arg-type]
                    )
                    yield (f"checkpoint {value} of region {region_id(i)} written", state, None)
                    if Variant.UNFENCED_CHECKPOINT in self.variant and s.term < b.max_terms:
                        op = ("route", s.term, i, value)
                        paused = s._replace(pending=s.pending | {op})
                        for label, nxt, bad in self._leader_changes(paused):
                            yield (
                                f"checkpoint {value} of region {region_id(i)} sent; {label}",
                                nxt,
                                bad,
                            )
            if b.registration and region.phase == LIVE and s.task is None:
                state = _regions(s, i, Region(GONE, (), -1, None, None, ()))
                state = state._replace(
                    routes=_put(s.routes, i, ABSENT),  # type: ignore[arg-type]
                    lmap=_put(s.lmap, i, ABSENT),  # type: ignore[arg-type]
                    stats=_put(s.stats, i, None),  # type: ignore[arg-type]
                )
                yield (f"region {region_id(i)} deregistered", state, None)
        for i, region in enumerate(s.regions):
            if (
                region.phase == NEW
                and s.task is None
                and s.routes[i] == ABSENT
                and s.lmap[i] == ABSENT
            ):
                state = _regions(s, i, region._replace(phase=LIVE))
                state = state._replace(
                    routes=_put(s.routes, i, None),  # type: ignore[arg-type]
                    lmap=_put(s.lmap, i, None),  # type: ignore[arg-type]
                )
                recorded = (
                    None
                    if Variant.UNIDENTIFIED_REGISTRATION in self.variant
                    else registered(s.marker, s.kafka.inc)
                )
                if recorded is not None:  # the marker's revision moves: CASes in flight fail
                    state = state._replace(marker=recorded, pending=_stale(state.pending))
                yield (f"region {region_id(i)} registered", state, None)

    # -- the regions ---------------------------------------------------------------------

    def _region_moves(self, s: State) -> Iterator[Transition]:
        b = self.bounds
        kafka = s.kafka
        for i, region in enumerate(s.regions):
            if region.phase != LIVE:
                continue
            rid = region_id(i)
            up = region.replay is None
            if up and kafka.hwm < b.max_hwm:
                state = _regions(s, i, region._replace(mem=(*region.mem, (kafka.inc, kafka.hwm))))
                state = state._replace(kafka=kafka._replace(owners=(*kafka.owners, rid)))
                yield (f"region {rid} writes entry {kafka.hwm}", state, None)
            if up and region.mem:
                flushed = region.mem[-1][1]
                yield (
                    f"region {rid} flushes to {flushed}",
                    _regions(s, i, region._replace(mem=(), flushed=flushed)),
                    None,
                )
            if (
                b.claims
                and up
                and not region.mem
                and kafka.hwm >= 1
                and region.claim != kafka.hwm - 1
            ):
                yield (
                    f"region {rid} idle at {kafka.hwm - 1}",
                    _regions(s, i, region._replace(claim=kafka.hwm - 1)),
                    None,
                )
            # A heartbeat carrying any value between what the leader holds and the truth.
            if s.lmap[i] != ABSENT and (up or b.reports_while_restarting):
                stored = s.stats[i]
                low = stored[0] if stored is not None else -1
                claims: tuple[int | None, ...] = (None,)
                if region.claim is not None:
                    # A report sent before the region was idle may arrive after the claim.
                    idle_now = up and not region.mem
                    if b.partial_reports:
                        claims = (None, region.claim)
                    elif idle_now:
                        claims = (region.claim,)
                for flushed in range(
                    low if b.partial_reports else region.flushed, region.flushed + 1
                ):
                    if not accepts(stored, flushed):
                        continue
                    for claim in claims:
                        stat = (flushed, claim)
                        if stat != stored:
                            state = s._replace(stats=_put(s.stats, i, stat))  # type: ignore[arg-type]
                            yield (
                                f"heartbeat of region {rid}: flushed {flushed}, idle claim {claim}",
                                state,
                                None,
                            )
            if b.replay and up:
                answer = self._answer(s, i)
                state = _regions(
                    s, i, region._replace(mem=(), claim=None, replay=answer, lost=region.mem)
                )
                shown = "an error" if answer == ERROR else str(answer)
                yield (
                    f"region {rid} restarts; replay-start answers {shown}",
                    state,
                    self._check_answer(state, i, answer),
                )
            if region.replay == ERROR:
                answer = self._answer(s, i)
                if answer != ERROR:
                    state = _regions(s, i, region._replace(replay=answer))
                    yield (
                        f"region {rid} asks replay-start again: {answer}",
                        state,
                        self._check_answer(state, i, answer),
                    )
            elif region.replay is not None:
                start = self.product.replay_from(region.replay, region.flushed)
                # Skips were checked on the answer; the datanode only raises the start to
                # its own flushed id + 1 (`replay_from`). Here: is it readable?
                bad = check_replay_start(s, i, start, start - 1, "replayed")
                if start < kafka.log_start:
                    state = _regions(s, i, region._replace(replay=ERROR))
                    yield (f"region {rid} replays from {start}: offset out of range", state, bad)
                else:
                    mem = tuple(e for e in region.lost if e[0] == kafka.inc and e[1] >= start)
                    # Having read to the end, an empty memtable is idle at the latest entry.
                    claim = kafka.hwm - 1 if b.claims and not mem and kafka.hwm else None
                    region = region._replace(replay=None, lost=(), mem=mem, claim=claim)
                    state = _regions(s, i, region)
                    yield (f"region {rid} replays from {start}", state, bad)

    def _check_answer(self, s: State, i: int, answer: int) -> str | None:
        """An answer never skips an entry the region has not flushed, unless the region
        itself said it had (its stat or checkpoint: `check_replay_start`). (It may be
        below the log start: the datanode starts at `replay_from`, checked when it
        replays.)"""
        if answer == ERROR:
            return None
        stat = s.stats[i]
        checkpoint = s.lmap[i]
        own = (
            stat_prunable(stat)
            if stat is not None
            else checkpoint
            if isinstance(checkpoint, int) and checkpoint != ABSENT
            else -1
        )
        found = check_replay_start(s, i, answer, own, "answered")
        return found if found is not None and found.startswith("replay skips") else None

    def _answer(self, s: State, i: int) -> int:
        if s.lmap[i] == ABSENT:
            return ERROR
        record = s.record
        in_flight = None if record is None else record.target
        planned = None if record is None else record.topic_id
        return self.product.replay_start(
            i, s.stats[i], s.lmap[i], s.marker, s.kafka, in_flight, planned
        )

    # -- Kafka moved by something else ---------------------------------------------------

    def _outside_moves(self, s: State) -> Iterator[Transition]:
        b = self.bounds
        kafka = s.kafka
        if s.outside < b.outside_moves:
            for start in range(kafka.log_start + 1, kafka.hwm + 1):
                state = s._replace(kafka=kafka._replace(log_start=start), outside=s.outside + 1)
                yield (f"retention moves the log start to {start}", state, None)
            if kafka.hwm < b.max_hwm:
                state = s._replace(
                    kafka=kafka._replace(owners=(*kafka.owners, FOREIGN)), outside=s.outside + 1
                )
                yield (f"another producer writes entry {kafka.hwm}", state, None)
        planned = s.record is not None and s.record.step != "prepare"
        if s.resets < b.resets and (planned or not b.recreate_during_purge_only):
            state = s._replace(kafka=Kafka(kafka.inc + 1, 0, (), 0), resets=s.resets + 1)
            yield ("the topic is deleted and recreated (offsets from 0)", state, None)

    def _consumer_moves(self, s: State) -> Iterator[Transition]:
        """The consumer group reads and commits, only forward: from the log start when it
        has committed nothing, up to the high watermark."""
        if not self.bounds.consumer:
            return
        kafka = s.kafka
        committed = kafka.committed
        low = kafka.log_start if committed is None else committed + 1
        for offset in range(low, kafka.hwm + 1):
            state = s._replace(kafka=kafka._replace(committed=offset))
            yield (f"the consumer group commits {offset}", state, None)

    def _archive_moves(self, s: State) -> Iterator[Transition]:
        """An archiver writes one object: any range of what Kafka holds that the bucket
        does not hold whole yet (the group's commits are separate moves)."""
        if not self.bounds.archive:
            return
        kafka = s.kafka
        for first in range(kafka.log_start, kafka.hwm):
            for end in range(first + 1, kafka.hwm + 1):
                bits = ((1 << (end - first)) - 1) << first
                if kafka.archived & bits != bits:
                    state = s._replace(kafka=kafka._replace(archived=kafka.archived | bits))
                    yield (f"an archiver writes the object [{first}, {end - 1}]", state, None)

    def successors(self, s: State) -> Iterator[Transition]:
        yield from self._task_moves(s)
        yield from self._landings(s)
        yield from self._leader_moves(s)
        yield from self._region_moves(s)
        yield from self._outside_moves(s)
        yield from self._consumer_moves(s)
        yield from self._archive_moves(s)
