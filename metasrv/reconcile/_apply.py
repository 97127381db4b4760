"""`--apply`: repair the safe classes of findings, through metasrv's own API.

The planner is a pure function of the findings; the executor goes through the leader's
HTTP API with the operator token (so registration and removal take the topic locks and
the fencing checks every other change takes) and never writes the kv backend itself.
Topic creation goes to Kafka directly (metasrv has no endpoint for it; the topic map
does not change). Every action is idempotent: an already registered region (409), an
already removed region (404) or an already existing topic counts as done.

Safe classes, and nothing else:
- `unmapped_region` whose reported topic exists in Kafka (or is created by this apply):
  registered on that topic with the node that reported it, only when nothing it still
  needs lies at or below the topic's marker or below Kafka's log start
  (`_rules.registration_hides`): once mapped, the purge plan's `max(prunable, marker)`
  and replay-start would skip those entries silently. Such a region is WAL data loss
  (the job reports it critical); it is left unregistered. Checked on the run's evidence
  when planning and again on the leader's view of the topic just before registering.
- `missing_topic` with no evidence it ever held data (no `pruned_entry_id`, no mapped
  region with a known prunable entry id >= 0): created. Recreating a topic that held
  entries would hide WAL data loss (DESIGN §2, invariant 7), so those stay findings.
- `stale_region` stale for at least `--drop-stale-after`, and only with that flag:
  removed, unless the leader has heard from it within that time (checked just before).
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from metasrv import wire
from metasrv.errors import Conflict, MetasrvError, NotFound, Unavailable
from metasrv.reconcile._findings import Finding
from metasrv.reconcile._rules import registration_hides
from metasrv.wire import FindingKind

logger = logging.getLogger(__name__)

SKIP_EXAMPLES = 20
"""Skipped findings listed per reason (the rest are counted)."""


class ActionKind(enum.StrEnum):
    """What the executor may do."""

    CREATE_TOPIC = "create_topic"
    REGISTER_REGION = "register_region"
    DROP_REGION = "drop_region"


class Outcome(enum.StrEnum):
    """What an action did."""

    DONE = "done"
    """The change was made."""
    ALREADY = "already"
    """Nothing to do: the state was already as wanted (idempotent repeat)."""
    SKIPPED = "skipped"
    """Not done: a check just before acting said it was no longer safe."""
    FAILED = "failed"
    """The API or Kafka refused."""


@dataclass(frozen=True, slots=True)
class Action:
    """One planned repair."""

    kind: ActionKind
    """What to do."""
    topic: str | None
    """Topic to create, or to register the region on."""
    region_id: int | None = None
    """Region to register or drop."""
    node_id: int | None = None
    """Node to register the region with."""
    min_stale_s: float | None = None
    """For a drop: the leader must not have heard from the region within this many seconds."""
    prunable_entry_id: int | None = None
    """For a registration: the region's prunable entry id in the run's latest stat of it."""
    marker: int | None = None
    """For a registration: the topic's `pruned_entry_id` the run read."""
    log_start_offset: int | None = None
    """For a registration: the topic's log start the run read."""

    @property
    def finding_key(self) -> tuple[str, str | None, int | None]:
        """The `Finding.key` this action repairs."""
        kind = {
            ActionKind.CREATE_TOPIC: FindingKind.MISSING_TOPIC,
            ActionKind.REGISTER_REGION: FindingKind.UNMAPPED_REGION,
            ActionKind.DROP_REGION: FindingKind.STALE_REGION,
        }[self.kind]
        return (kind.value, self.topic, self.region_id)


@dataclass(frozen=True, slots=True)
class ActionResult:
    """One executed action."""

    action: Action
    """What was attempted."""
    outcome: Outcome
    """How it went."""
    detail: str = ""
    """Why, for anything but DONE."""


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    """The planner's decision."""

    actions: list[Action]
    """Repairs to make, topics first (registrations may need them)."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Fixable-class findings left alone, counted by reason."""
    skipped_examples: dict[str, list[tuple[str, str | None, int | None]]] = field(
        default_factory=dict
    )
    """A few finding keys per skip reason."""


def plan_actions(
    findings: Iterable[Finding],
    *,
    kafka_topics: Collection[str],
    drop_stale_after: float | None,
) -> ApplyPlan:
    """Decide which findings to repair. Pure: no I/O."""
    creates: dict[str, Action] = {}
    registers: dict[int, Action] = {}
    drops: dict[int, Action] = {}
    skipped: Counter[str] = Counter()
    examples: dict[str, list[tuple[str, str | None, int | None]]] = {}
    pending_unmapped: list[Finding] = []

    def skip(f: Finding, reason: str) -> None:
        skipped[reason] += 1
        listed = examples.setdefault(reason, [])
        if len(listed) < SKIP_EXAMPLES:
            listed.append(f.key)

    for f in findings:
        if f.kind is FindingKind.MISSING_TOPIC and f.topic is not None:
            if f.evidence.get("held_data"):
                skip(f, "missing topic held data: recreating it would hide WAL data loss")
            else:
                creates[f.topic] = Action(ActionKind.CREATE_TOPIC, f.topic)
        elif f.kind is FindingKind.UNMAPPED_REGION and f.region_id is not None:
            pending_unmapped.append(f)
        elif f.kind is FindingKind.STALE_REGION and f.region_id is not None:
            if drop_stale_after is None:
                skip(f, "stale regions are dropped only with --drop-stale-after")
                continue
            age = f.evidence.get("age_s")
            if age is None:
                age = f.evidence.get("unseen_for_at_least_s")
            if age is None or float(age) < drop_stale_after:
                skip(f, "stale for less than --drop-stale-after")
                continue
            drops.setdefault(
                f.region_id,
                Action(ActionKind.DROP_REGION, f.topic, f.region_id, min_stale_s=drop_stale_after),
            )
    existing = set(kafka_topics) | set(creates)
    for f in pending_unmapped:
        node = f.evidence.get("node_id")
        prunable, marker, log_start = (
            _int_or_none(f.evidence.get(k))
            for k in ("prunable_entry_id", "pruned_entry_id", "log_start_offset")
        )
        if f.topic is None or f.topic not in existing:
            skip(f, "reported topic does not exist in Kafka")
        elif type(node) is not int or node < 0:
            skip(f, "no valid node id in the report")
        elif registration_hides(prunable, marker, log_start) is not None:
            skip(f, HIDES_ENTRIES)
        elif f.region_id is not None:
            registers.setdefault(
                f.region_id,
                Action(
                    ActionKind.REGISTER_REGION,
                    f.topic,
                    f.region_id,
                    node,
                    prunable_entry_id=prunable,
                    marker=marker,
                    log_start_offset=log_start,
                ),
            )
    return ApplyPlan(
        actions=[*creates.values(), *registers.values(), *drops.values()],
        skipped=skipped,
        skipped_examples=examples,
    )


HIDES_ENTRIES = (
    "WAL data loss: the region needs entries at or below its topic's marker or below "
    "Kafka's log start; registering it would hide them"
)


def _int_or_none(value: object) -> int | None:
    return value if type(value) is int else None


class RegionApi(Protocol):
    """The slice of `metasrv.wire.MetasrvClient` the executor uses."""

    def add_region(self, region_id: int, node_id: int, topic: str | None = None) -> Any: ...

    def topic(self, topic: str) -> wire.Topic: ...

    def drop_region(self, region_id: int) -> None: ...

    def region(self, region_id: int) -> wire.Region: ...


class TopicCreator(Protocol):
    """The slice of `metasrv.kafka.KafkaAdmin` the executor uses."""

    def ensure_topics(
        self,
        topics: Iterable[str],
        *,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
    ) -> list[str]: ...


def execute_plan(
    plan: ApplyPlan,
    api: RegionApi,
    kafka: TopicCreator,
    *,
    replication_factor: int = 1,
    topic_config: Mapping[str, str] | None = None,
    on_done: Callable[[ActionResult], None] = lambda r: None,
    collect: list[ActionResult] | None = None,
) -> list[ActionResult]:
    """Carry out the plan in order. `Unavailable` (metasrv or Kafka down) propagates.

    Results are appended to `collect` (when given) as they happen, so a caller still
    knows what was done when an error stops the run.
    """
    results: list[ActionResult] = [] if collect is None else collect

    def record(result: ActionResult) -> None:
        results.append(result)
        on_done(result)
        logger.info(
            "reconcile apply",
            extra={
                "action": result.action.kind.value,
                "topic": result.action.topic,
                "region_id": result.action.region_id,
                "outcome": result.outcome.value,
            },
        )

    topics = [a for a in plan.actions if a.kind is ActionKind.CREATE_TOPIC]
    if topics:
        created = set(
            kafka.ensure_topics(
                [a.topic for a in topics if a.topic],
                replication_factor=replication_factor,
                config=topic_config,
            )
        )
        for a in topics:
            if a.topic in created:
                record(ActionResult(a, Outcome.DONE))
            else:
                record(ActionResult(a, Outcome.ALREADY, "topic exists"))
    for a in plan.actions:
        if a.kind is ActionKind.REGISTER_REGION:
            record(_register(api, a))
        elif a.kind is ActionKind.DROP_REGION:
            record(_drop(api, a))
    return results


def _register(api: RegionApi, a: Action) -> ActionResult:
    assert a.region_id is not None and a.node_id is not None and a.topic is not None
    # A purge since the run may have moved the topic past the region (it purges without
    # it while it is unmapped): judge again on the leader's view of the topic. A topic the
    # leader does not know (no region, not in the pool) is purged by nobody.
    try:
        mapped = api.region(a.region_id)
    except NotFound:
        pass
    else:
        return ActionResult(a, Outcome.ALREADY, f"region already registered on {mapped.topic}")
    marker, log_start = a.marker, a.log_start_offset
    try:
        view = api.topic(a.topic)
    except NotFound:
        pass
    except MetasrvError as exc:
        if isinstance(exc, Unavailable):
            raise
        return ActionResult(a, Outcome.FAILED, exc.message)
    else:
        marker = _higher(marker, view.pruned_entry_id)
        log_start = _higher(log_start, view.log_start_offset)
    hides = registration_hides(a.prunable_entry_id, marker, log_start)
    if hides is not None:
        return ActionResult(a, Outcome.SKIPPED, f"WAL data loss: {hides}")
    try:
        api.add_region(a.region_id, a.node_id, a.topic)
    except Conflict as exc:
        return ActionResult(a, Outcome.ALREADY, exc.message)
    except MetasrvError as exc:
        if isinstance(exc, Unavailable):
            raise
        return ActionResult(a, Outcome.FAILED, exc.message)
    return ActionResult(a, Outcome.DONE)


def _higher(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _drop(api: RegionApi, a: Action) -> ActionResult:
    assert a.region_id is not None
    try:
        view = api.region(a.region_id)
    except NotFound:
        return ActionResult(a, Outcome.ALREADY, "region not registered")
    if a.topic is not None and view.topic != a.topic:
        return ActionResult(
            a, Outcome.SKIPPED, f"region is now mapped to {view.topic}, not {a.topic}"
        )
    age = None if view.stat is None else view.stat.age_seconds
    if age is not None and a.min_stale_s is not None and age < a.min_stale_s:
        return ActionResult(a, Outcome.SKIPPED, f"the leader heard from it {age:.0f}s ago")
    try:
        api.drop_region(a.region_id)
    except NotFound:
        return ActionResult(a, Outcome.ALREADY, "region not registered")
    except MetasrvError as exc:
        if isinstance(exc, Unavailable):
            raise
        return ActionResult(a, Outcome.FAILED, exc.message)
    return ActionResult(a, Outcome.DONE)
