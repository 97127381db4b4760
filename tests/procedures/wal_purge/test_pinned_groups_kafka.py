"""Pinned consumer groups against real Kafka and etcd (DESIGN §8): a real consumer group
commits offsets on the WAL topic, and every purge stops at its committed offset; a pinned
group with no committed offset blocks the topic; as the group moves forward, the next purge
follows; a purge resumed under a pin its leader did not have never deletes past the group.
"""

from __future__ import annotations

from procedures import ProcedureState
from procedures.wal_purge import (
    NO_COMMITTED_OFFSET,
    gather_plans,
    submit_purges,
)
from tests._archive import commit_offset
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory
from tests.procedures.wal_purge._interrupted import died_before_delete


async def purge(h: Harness, topic: str) -> tuple[ProcedureState, str]:
    [pid] = await submit_purges(h.manager, [topic], reason="test")
    view = await h.manager.wait(pid, 30)
    assert view.state.terminal, view
    return view.state, view.outcome or ""


async def pinned_world(factory: HarnessFactory, *groups: str) -> tuple[Harness, str]:
    """One region on topic 0 flushed to 70 of 100 entries, `groups` pinned."""
    h = await factory(wal={"pin_consumer_groups": list(groups)})
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report(1, topic, flushed=70)
    return h, topic


async def test_a_purge_stops_at_a_pinned_groups_committed_offset(
    harness_factory: HarnessFactory, unique_prefix: str
) -> None:
    cdc, standby = f"{unique_prefix}-cdc", f"{unique_prefix}-standby"
    h, topic = await pinned_world(harness_factory, cdc, standby)
    commit_offset(h.bootstrap, cdc, topic, 30)
    commit_offset(h.bootstrap, standby, topic, 90)

    [inputs] = (await gather_plans(h.services, [topic])).values()
    plan = inputs.plan
    assert plan.prune_point == 30 and plan.reclaimable_entries == 30
    shown = [(g.group, g.committed_offset, g.lag, g.holds) for g in plan.pinned_groups]
    assert shown == [(cdc, 30, 70, True), (standby, 90, 10, False)]

    state, outcome = await purge(h, topic)

    assert state is ProcedureState.SUCCEEDED and "to 30" in outcome
    assert h.offsets(topic).log_start_offset == 30
    assert h.marker(topic) == 30
    # The group reads 30 next: it is still there; nothing below it is.
    assert h.readable(topic, 30) and not h.readable(topic, 29)


async def test_a_pinned_group_with_no_committed_offset_blocks_the_topic(
    harness_factory: HarnessFactory, unique_prefix: str
) -> None:
    cdc, silent = f"{unique_prefix}-cdc", f"{unique_prefix}-silent"
    h, topic = await pinned_world(harness_factory, cdc, silent)
    commit_offset(h.bootstrap, cdc, topic, 50)

    [inputs] = (await gather_plans(h.services, [topic])).values()
    assert inputs.plan.prune_point is None and inputs.plan.blocking_groups == (silent,)

    state, outcome = await purge(h, topic)

    assert state is ProcedureState.SKIPPED
    assert f"consumer group {silent} ({NO_COMMITTED_OFFSET})" in outcome
    assert h.offsets(topic).log_start_offset == 0
    assert h.marker(topic) is None


async def test_the_next_purge_follows_the_group_forward(
    harness_factory: HarnessFactory, unique_prefix: str
) -> None:
    cdc = f"{unique_prefix}-cdc"
    h, topic = await pinned_world(harness_factory, cdc)
    cuts = []
    for committed in (10, 45, 100):  # the last past what the region needs (70)
        commit_offset(h.bootstrap, cdc, topic, committed)
        state, _ = await purge(h, topic)
        assert state is ProcedureState.SUCCEEDED
        cuts.append((h.offsets(topic).log_start_offset, h.marker(topic)))
    assert cuts == [(10, 10), (45, 45), (70, 70)]


async def test_a_purge_resumed_under_a_new_pin_stops_at_the_group(
    harness_factory: HarnessFactory, unique_prefix: str
) -> None:
    cdc = f"{unique_prefix}-cdc"
    # A leader without the pin planned P = 70, persisted it as its target and moved the
    # marker there, then died before DeleteRecords.
    old, topic, pid = await died_before_delete(harness_factory, target=70)
    # The group reads 30 next; the new leader's settings pin it.
    commit_offset(old.bootstrap, cdc, topic, 30)

    new = await harness_factory(wal={"pin_consumer_groups": [cdc]})
    view = await new.manager.wait(pid, 30)

    assert view.state is ProcedureState.SUCCEEDED, view
    # Catching up to the marker (70) would delete what the group has not read.
    assert new.offsets(topic).log_start_offset == 30
    assert new.marker(topic) == 70  # never moves back
    assert new.readable(topic, 30)
