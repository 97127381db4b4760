"""Mailbox: flush instructions ride heartbeats until applied or expired."""

from __future__ import annotations

import asyncio

from metasrv.leader import FLUSH_REGIONS, InstructionState, Mailbox, RegionRegistry
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from tests import _stats as heartbeats
from tests._metrics import sample


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stat(region_id: int, flushed: int, memtable: int = 10) -> RegionStat:
    return RegionStat(
        region_id=region_id,
        node_id=1,
        topic="t",
        flushed_entry_id=flushed,
        topic_latest_entry_id=None,
        memtable_bytes=memtable,
        manifest_version=1,
        received_at=0.0,
    )


def report(reg: RegionRegistry, *stats: RegionStat) -> None:
    """Store the stats as a heartbeat does (every one on topic "t")."""
    heartbeats.report(reg, stats)


def setup() -> tuple[RegionRegistry, Mailbox, Clock, Metrics]:
    reg = RegionRegistry()
    clock = Clock()
    metrics = Metrics()
    return reg, Mailbox(reg, metrics=metrics, clock=clock), clock, metrics


def test_instruction_rides_every_heartbeat_until_applied() -> None:
    reg, box, _, metrics = setup()
    report(reg, stat(1, 10), stat(2, 20))
    iid = box.send_flush(5, [1, 2], ttl=30)
    assert sample(metrics, "metasrv_flush_instructions_sent_total") == 1
    wire = {"id": iid, "kind": FLUSH_REGIONS, "region_ids": [1, 2]}
    assert box.pending_wire(5) == [wire]
    assert box.pending_wire(5) == [wire]
    assert [i.id for i in box.pending(5)] == [iid]
    assert box.pending(6) == []

    # Region 1 flushed, region 2 not yet: still pending, only region 2 outstanding.
    assert box.observe(5, {1: stat(1, 11), 2: stat(2, 20)}) == []
    assert box.unflushed(iid) == (2,)
    assert box.state(iid) is InstructionState.PENDING
    assert box.pending_wire(5) == [wire]

    assert box.observe(5, {2: stat(2, 25)}) == [iid]
    assert box.state(iid) is InstructionState.APPLIED
    assert box.pending_wire(5) == []


def test_same_flushed_id_is_not_a_flush_but_empty_memtable_is() -> None:
    reg, box, _, _ = setup()
    report(reg, stat(1, 10), stat(2, 20))
    iid = box.send_flush(5, [1, 2], ttl=30)
    box.observe(5, {1: stat(1, 10), 2: stat(2, 20)})
    assert box.unflushed(iid) == (1, 2)
    box.observe(5, {1: stat(1, 10, memtable=0)})
    assert box.unflushed(iid) == (2,)


def test_region_without_stat_at_send_time_needs_any_flush() -> None:
    _, box, _, _ = setup()
    iid = box.send_flush(5, [9], ttl=30)
    box.observe(5, {9: stat(9, -1)})
    assert box.state(iid) is InstructionState.PENDING
    box.observe(5, {9: stat(9, 0)})
    assert box.state(iid) is InstructionState.APPLIED


def test_stats_from_another_node_do_not_apply() -> None:
    reg, box, _, _ = setup()
    report(reg, stat(1, 10))
    iid = box.send_flush(5, [1], ttl=30)
    box.observe(6, {1: stat(1, 50)})
    assert box.state(iid) is InstructionState.PENDING


def test_expired_instruction_is_dropped() -> None:
    _reg, box, clock, _ = setup()
    iid = box.send_flush(5, [1], ttl=30)
    clock.now += 29.9
    assert box.pending(5) != []
    clock.now += 0.2
    assert box.pending_wire(5) == []
    assert box.state(iid) is InstructionState.EXPIRED
    assert box.state("unknown") is None


def test_clear_expires_everything() -> None:
    _, box, _, _ = setup()
    a = box.send_flush(5, [1], ttl=30)
    b = box.send_flush(6, [2], ttl=30)
    box.clear()
    assert box.pending(5) == [] and box.pending(6) == []
    assert box.state(a) is InstructionState.EXPIRED
    assert box.state(b) is InstructionState.EXPIRED


def test_duplicate_region_ids_are_collapsed_and_empty_list_is_applied() -> None:
    _, box, _, _ = setup()
    iid = box.send_flush(5, [3, 3, 4], ttl=30)
    assert box.pending_wire(5)[0]["region_ids"] == [3, 4]
    empty = box.send_flush(5, [], ttl=30)
    assert box.state(empty) is InstructionState.APPLIED
    assert box.state(iid) is InstructionState.PENDING


async def test_wait_returns_when_applied() -> None:
    reg, box, _, _ = setup()
    report(reg, stat(1, 10))
    iid = box.send_flush(5, [1], ttl=30)
    waiter = asyncio.create_task(box.wait(iid, timeout=5))
    await asyncio.sleep(0)  # one loop step, not a wait: the waiter parks on the instruction
    assert not waiter.done()
    box.observe(5, {1: stat(1, 12)})  # the heartbeat that shows the flush
    assert await asyncio.wait_for(waiter, 1) is InstructionState.APPLIED


async def test_wait_times_out_as_pending() -> None:
    _, box, _, _ = setup()
    iid = box.send_flush(5, [1], ttl=30)
    assert await box.wait(iid, timeout=0.05) is InstructionState.PENDING
