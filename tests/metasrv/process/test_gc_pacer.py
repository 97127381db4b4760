"""The GC pacer collects from the event loop, in small steps, with automatic GC off."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from metasrv.process import FULL_EVERY, MIDDLE_EVERY, GcPacer
from tests._wait import eventually


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


def test_a_pass_frees_a_young_cycle(automatic_gc_off: None) -> None:
    gc.collect()
    ref = garbage_cycle()
    assert ref() is not None  # only a collection can free a cycle
    GcPacer().collect()
    assert ref() is None


def test_older_generations_are_collected_on_schedule(automatic_gc_off: None) -> None:
    pacer = GcPacer()
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        for _ in range(FULL_EVERY):
            pacer.collect()
    finally:
        gc.callbacks.remove(note)
    assert seen.count(2) == 1
    assert seen.count(1) == FULL_EVERY // MIDDLE_EVERY - 1
    assert seen.count(0) == FULL_EVERY - FULL_EVERY // MIDDLE_EVERY
    assert seen[-1] == 2


async def test_the_pacer_collects_without_any_allocation_trigger(automatic_gc_off: None) -> None:
    gc.collect()
    pacer = GcPacer(interval=0.01)
    await pacer.start()
    try:
        ref = garbage_cycle()
        await eventually(lambda: ref() is None, "the cycle collected", timeout=5)
    finally:
        await pacer.stop()
    assert pacer.task is None
