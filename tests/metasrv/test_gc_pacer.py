"""The GC pacer collects from the event loop, in small steps, with automatic GC off."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from metasrv.gc_pacer import GcPacer, collect_due


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def garbage_cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def automatic_gc_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_collect_due_frees_a_young_cycle(automatic_gc_off: None) -> None:
    gc.collect()
    ref = garbage_cycle()
    assert ref() is not None  # only a collection can free a cycle
    collect_due()
    assert ref() is None


def test_collect_due_takes_the_older_generation_when_its_count_is_due(
    automatic_gc_off: None,
) -> None:
    gc.collect()
    threshold1 = gc.get_threshold()[1]
    for _ in range(threshold1):
        gc.collect(0)
    assert gc.get_count()[1] >= threshold1
    collect_due()  # gen 1: its count goes back to 0 and gen 2's goes up
    assert gc.get_count()[1] == 0
    assert gc.get_count()[2] >= 1


async def test_the_pacer_collects_without_any_allocation_trigger(automatic_gc_off: None) -> None:
    gc.collect()
    pacer = GcPacer(interval=0.01)
    await pacer.start()
    try:
        ref = garbage_cycle()
        for _ in range(100):
            if ref() is None:
                break
            await asyncio.sleep(0.01)
        assert ref() is None
    finally:
        await pacer.stop()
    assert pacer.task is None
