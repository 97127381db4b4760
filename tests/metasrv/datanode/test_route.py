"""Which metasrv a request goes to (`Route`/`Attempt`): the routing rules, pure."""

from __future__ import annotations

import pytest

from metasrv.datanode import Route
from metasrv.errors import InvalidArgument

A, B, C = "http://10.0.0.1:4000", "http://10.0.0.2:4000", "http://10.0.0.3:4000"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def route(*addrs: str, clock: Clock | None = None) -> Route:
    return Route(list(addrs), quarantine=5.0, clock=clock or Clock())


def test_addresses_are_normalised_and_deduplicated() -> None:
    r = Route(["10.0.0.1:4000", A, "0.0.0.0:4001", "http://x:1/"])
    assert r.urls == [A, "http://127.0.0.1:4001", "http://x:1"]
    assert r.current == A
    with pytest.raises(InvalidArgument):
        Route([])


def test_a_421_naming_the_leader_is_followed_at_once_and_the_leader_kept() -> None:
    r = route(A, B, C)
    attempt = r.attempt()
    assert attempt.next() == A
    attempt.not_leader(A, "10.0.0.3:4000")
    assert attempt.next() == C
    attempt.served(C)
    assert r.current == C
    assert r.attempt().next() == C


def test_a_leader_not_configured_is_followed_and_learned() -> None:
    r = route(A)
    attempt = r.attempt()
    assert attempt.next() == A
    attempt.not_leader(A, "10.9.9.9:4000")
    assert attempt.next() == "http://10.9.9.9:4000"
    assert r.urls == [A, "http://10.9.9.9:4000"]


def test_after_the_leader_dies_its_followers_are_asked_and_it_is_not_followed_back() -> None:
    clock = Clock()
    r = route(A, B, clock=clock)
    first = r.attempt()
    assert first.next() == A
    first.unreachable(A)  # the leader was SIGKILLed
    assert first.next() == B
    first.not_leader(B, A)  # B still names A until A's lease runs out
    assert first.next() is None  # A was tried in this attempt: back off
    assert r.current == B
    second = r.attempt()
    assert second.next() == B
    second.not_leader(B, A)  # A is quarantined: not followed
    assert second.next() is None
    assert second.tried == [B]
    clock.now += 5.0  # quarantine over: A may be the leader again
    third = r.attempt()
    assert third.next() == B
    third.not_leader(B, A)
    assert third.next() == A


def test_a_503_ends_the_attempt_and_the_next_one_starts_there() -> None:
    r = route(A, B)
    attempt = r.attempt()
    assert attempt.next() == A
    attempt.not_leader(A, B)
    assert attempt.next() == B
    attempt.loading(B)  # B won the election and is loading its map
    assert attempt.next() is None
    assert r.current == B
    assert r.attempt().next() == B


def test_without_a_named_leader_every_address_is_tried_once_in_order() -> None:
    r = route(A, B, C)
    r.current = B
    attempt = r.attempt()
    seen = []
    while (url := attempt.next()) is not None:
        seen.append(url)
        attempt.not_leader(url, None)  # an election under way
    assert seen == [B, C, A]


def test_quarantined_addresses_are_tried_last_and_only_when_none_answered() -> None:
    clock = Clock()
    r = route(A, B, C, clock=clock)
    attempt = r.attempt()
    for expected in (A, B, C):
        assert attempt.next() == expected
        attempt.unreachable(expected)
    assert attempt.next() is None
    # Every address is down: the next attempt still tries them all (nobody answered).
    retry = r.attempt()
    seen = []
    while (url := retry.next()) is not None:
        seen.append(url)
        retry.unreachable(url)
    assert sorted(seen) == [A, B, C]


def test_a_single_address_is_always_retried() -> None:
    r = route(A)
    for _ in range(3):
        attempt = r.attempt()
        assert attempt.next() == A
        attempt.unreachable(A)
        assert attempt.next() is None
    assert r.current == A and r.is_down(A)
    attempt = r.attempt()
    assert attempt.next() == A
    attempt.served(A)
    assert not r.is_down(A)


def test_an_address_that_serves_leaves_quarantine() -> None:
    clock = Clock()
    r = route(A, B, clock=clock)
    attempt = r.attempt()
    assert attempt.next() == A
    attempt.unreachable(A)
    assert r.is_down(A)
    assert attempt.next() == B
    attempt.not_leader(B, None)
    assert attempt.next() is None
    retry = r.attempt()
    assert retry.next() == B
    retry.not_leader(B, None)
    # Nobody else answers, but B answered: quarantined A is left alone this time.
    assert retry.next() is None
    clock.now += 6
    again = r.attempt()
    assert again.next() == B
    again.not_leader(B, A)
    assert again.next() == A
    again.served(A)
    assert not r.is_down(A) and r.current == A
