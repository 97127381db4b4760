"""The exhaustive protocol model (tests/procedures/wal_purge/protocol_model): the product
holds in every world of the small bounds, and the search catches every known-bad variant.

A counterexample fails its test with the trace in the failure output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from tests.procedures.wal_purge.protocol_model import (
    IDLE_REPLAY,
    LARGE,
    PIN_LATER,
    SMALL,
    Bounds,
    Counterexample,
    Result,
    Variant,
    search,
)

Wanted = Callable[[Counterexample], bool]


def _traces(result: Result) -> str:
    return "\n\n".join(c.render() for c in result.counterexamples)


def _holds(result: Result) -> None:
    print(result.summary())
    assert result.complete, result.summary()
    assert not result.counterexamples, f"{result.summary()}\n{_traces(result)}"


def _kind(kind: str, *, through: str | None = None) -> Wanted:
    """A counterexample of `kind` whose trace has a step containing `through`."""

    def wanted(example: Counterexample) -> bool:
        if not example.violation.startswith(kind):
            return False
        return through is None or any(through in label for label, _ in example.trace)

    return wanted


def _deleted_after_a_marker_was_recreated(example: Counterexample) -> bool:
    """A needed entry deleted from a topic recreated after a marker was written for it."""
    if not example.violation.startswith("needed entry deleted"):
        return False
    labels = [label for label, _ in example.trace]
    marked = [
        n for n, label in enumerate(labels) if label.startswith("marker CAS") and " lands" in label
    ]
    recreated = [n for n, label in enumerate(labels) if "recreated" in label]
    return bool(marked and recreated and recreated[0] > marked[0])


@pytest.mark.parametrize("world", ["purge", "idle", "replay"])
def test_the_protocol_holds_in_the_small_bounds(world: str) -> None:
    _holds(search(SMALL[world], stop_at_first=False))


def _unmarked_recreation(example: Counterexample) -> bool:
    """The topic was recreated while no marker recorded its Kafka topic id."""
    states = [state for _, state in example.trace]
    for r, (label, _) in enumerate(example.trace):
        if "recreated" in label and (r == 0 or states[r - 1].marker is None):
            return True
    return False


def test_the_kafka_world_holds() -> None:
    """Kafka's offsets moved by something else: retention, another producer, the topic
    deleted and recreated at any point, before its first purge included (a registration
    records Kafka's topic id in the marker, so the regions' reports belong to a known
    topic), and replay-start after a recreation answers an error, not the old marker's
    offset (ebd3d58; before it, the model found: flushed 0, purged to 0, the topic
    recreated, the region writes entry 0 and restarts: replay-start answered 1)."""
    _holds(search(SMALL["kafka"], stop_at_first=False))


RECREATED_DURING_A_PURGE = replace(SMALL["kafka"], recreate_during_purge_only=True)
"""The `kafka` world with the topic recreated only while a purge runs past prepare."""


def test_a_topic_recreated_during_a_purge_loses_nothing() -> None:
    """A topic recreated while a purge runs past its prepare step is a topic reset: prepare
    persists the id it planned on and the flush and purge steps compare Kafka's with it
    (issue #34; before, the model found: flushed 1, prepare P=1, the topic recreated, the
    region writes 0 and 1 again, the marker moves to 1 recording the new id and
    DeleteRecords(1) deletes the new entry 0)."""
    _holds(search(RECREATED_DURING_A_PURGE, stop_at_first=False))


def test_a_region_idle_under_a_purge_replays_from_a_readable_offset() -> None:
    """A report without the idle claim accepted after the purge step re-validated lowers
    the region's prunable id below the target; replay-start answers above the target of
    the purge in flight (issue #34), so the region replays from an offset Kafka keeps."""
    result = search(IDLE_REPLAY, wanted=_kind("replay below the log start"))
    assert not [c for c in result.counterexamples if c.violation.startswith("replay below")], (
        _traces(result)
    )


def test_a_pinned_consumer_group_is_never_cut_past() -> None:
    """A consumer group committing forward and pinned from the start: no DeleteRecords
    passes its committed offset, and none lands while it has committed nothing (DESIGN
    §8), whatever the leader changes, late writes and registrations."""
    _holds(search(SMALL["pinned"], stop_at_first=False))


def test_a_group_pinned_by_a_later_leader_bounds_the_purge_it_resumes() -> None:
    """The group pinned only by a later leader's settings: a purge whose target was
    persisted (its marker moved, even) without the pin deletes, once resumed under it, only
    below the group's committed offset as read then (`decide_purge`'s catch-up clamp)."""
    _holds(search(PIN_LATER, stop_at_first=False))


def test_nothing_is_deleted_that_the_archive_does_not_hold() -> None:
    """With the WAL archive enabled (DESIGN §8, invariant 10) and its group pinned but
    committing apart from the objects written (its word is not the bucket): no DeleteRecords
    moves the log start past an entry no object holds, whatever the leader changes, late
    writes and resumed catch-ups."""
    _holds(search(SMALL["archive"], stop_at_first=False))


VARIANTS: list[tuple[Variant, Bounds, Wanted]] = [
    # Without the marker first, an idle region restarting after a leader change (no stat,
    # the old marker) is answered below what the deletion removed.
    (
        Variant.DELETE_BEFORE_MARKER,
        replace(IDLE_REPLAY, partial_reports=False, reports_while_restarting=False),
        _kind("replay below the log start"),
    ),
    (Variant.UNFENCED_CHECKPOINT, SMALL["replay"], _kind("deposed write landed")),
    (Variant.STALE_MAP_AT_TAKEOVER, SMALL["purge"], _kind("needed entry deleted")),
    (Variant.ORPHAN_ON_UNKNOWN_CREATE, SMALL["purge"], _kind("liveness")),
    # ef11397 cut a topic recreated after its marker was written (issue #34, 1).
    (Variant.NO_TOPIC_RESET_CHECK, SMALL["kafka"], _deleted_after_a_marker_was_recreated),
    # Without the topic id a registration records, a topic recreated before its first
    # purge is planned by the old topic's reports (issue #34).
    (Variant.UNIDENTIFIED_REGISTRATION, SMALL["kafka"], _unmarked_recreation),
    # A purge that plans without the pinned group deletes what the group has not read.
    (Variant.IGNORE_PIN, SMALL["pinned"], _kind("pinned entry deleted")),
    # A purge step that keeps a target persisted before the pin (a resume) without
    # reading the group again catches up past it.
    (
        Variant.STALE_PIN_AT_PURGE,
        PIN_LATER,
        _kind("pinned entry deleted", through="pin the consumer group"),
    ),
    # The pinned group alone lets a purge delete what no object holds.
    (Variant.NO_ARCHIVE_CHECK, SMALL["archive"], _kind("unarchived entry deleted")),
]


CONTROLLED_BY_THE_WORLD_TEST = {
    Variant.UNFENCED_CHECKPOINT,
    Variant.STALE_MAP_AT_TAKEOVER,
    Variant.ORPHAN_ON_UNKNOWN_CREATE,
    Variant.IGNORE_PIN,  # test_a_pinned_consumer_group_is_never_cut_past
    Variant.STALE_PIN_AT_PURGE,  # test_a_group_pinned_by_a_later_leader_bounds_the_purge_it_resumes
    Variant.NO_ARCHIVE_CHECK,  # test_nothing_is_deleted_that_the_archive_does_not_hold
}
"""Variants searched in a world the product holds in whole (the control is that test)."""


@pytest.mark.parametrize(
    ("variant", "bounds", "wanted"), VARIANTS, ids=[v.name or "" for v, _, _ in VARIANTS]
)
def test_the_search_catches_a_known_bad_variant(
    variant: Variant, bounds: Bounds, wanted: Wanted
) -> None:
    bad = search(bounds, variant, wanted=wanted)
    print(bad.summary())
    caught = [c for c in bad.counterexamples if wanted(c)]
    assert caught, f"no counterexample for {variant.name}: {bad.summary()}"
    print(caught[0].render())
    if variant in CONTROLLED_BY_THE_WORLD_TEST:
        return  # test_the_protocol_holds_in_the_small_bounds: nothing at all in that world
    # And the product as it is has none of that shape in the same world.
    good = search(bounds, wanted=wanted)
    assert not [c for c in good.counterexamples if wanted(c)], _traces(good)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", ["purge", "idle", "replay"])
def test_the_protocol_holds_in_the_large_bounds(world: str) -> None:
    _holds(search(LARGE[world], stop_at_first=False))
