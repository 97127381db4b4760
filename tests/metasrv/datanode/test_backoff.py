"""Capped exponential backoff, full jitter below the cap and a jittered period at it: the
bounds of every wait, and how the retries fall due after a leader starts serving (pure)."""

from __future__ import annotations

import random
import statistics

import pytest

from metasrv.datanode import Backoff
from metasrv.errors import InvalidArgument


class _Fixed(random.Random):
    """An RNG whose every draw is `value` (the edges of [0, 1))."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_the_ceiling_doubles_from_base_until_the_cap() -> None:
    backoff = Backoff(base=0.1, cap=3.0)
    assert [backoff.ceiling(k) for k in range(7)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0]
    )
    assert backoff.ceiling(10_000) == 3.0  # no overflow far past the cap


@pytest.mark.parametrize("attempt", [0, 1, 3, 5])
def test_below_the_cap_every_wait_lies_in_zero_to_the_ceiling(attempt: int) -> None:
    backoff = Backoff(base=0.05, cap=2.0)
    rng = random.Random(attempt)
    delays = [backoff.delay(attempt, rng) for _ in range(5000)]
    ceiling = backoff.ceiling(attempt)
    assert ceiling < backoff.cap
    assert all(0.0 <= d < ceiling for d in delays)
    assert backoff.delay(attempt, _Fixed(0.0)) == 0.0
    assert backoff.delay(attempt, _Fixed(0.999999)) == pytest.approx(ceiling * 0.999999)


@pytest.mark.parametrize("attempt", [6, 40])
def test_at_the_cap_every_wait_lies_in_the_top_tenth(attempt: int) -> None:
    backoff = Backoff(base=0.05, cap=2.0)
    rng = random.Random(attempt)
    delays = [backoff.delay(attempt, rng) for _ in range(5000)]
    assert all(1.8 <= d < 2.0 for d in delays)
    assert backoff.delay(attempt, _Fixed(0.0)) == pytest.approx(1.8)
    assert backoff.delay(attempt, _Fixed(0.999999)) == pytest.approx(2.0, abs=1e-5)


def test_the_wait_below_the_cap_is_uniform_over_the_whole_window_not_just_its_top() -> None:
    """Full jitter: mean ceiling/2, spread ceiling/sqrt(12) ("equal jitter" would be
    uniform over [ceiling/2, ceiling): mean 0.75 ceiling)."""
    backoff = Backoff(base=1.0, cap=2.0)
    delays = [backoff.delay(0, random.Random(seed)) for seed in range(4000)]
    assert statistics.fmean(delays) == pytest.approx(0.5, abs=0.03)
    assert statistics.pstdev(delays) == pytest.approx(1 / 12**0.5, abs=0.02)
    assert min(delays) < 0.01 and max(delays) > 0.99


def test_cap_jitter_one_is_full_jitter_at_the_cap_too() -> None:
    backoff = Backoff(base=1.0, cap=1.0, cap_jitter=1.0)
    delays = [backoff.delay(3, random.Random(seed)) for seed in range(4000)]
    assert statistics.fmean(delays) == pytest.approx(0.5, abs=0.03)
    assert min(delays) < 0.01 and max(delays) > 0.99


def _first_retries_after(
    serving: float, backoff: Backoff, interval: float, seed: int
) -> list[float]:
    """Seconds from `serving` to each of 1,000 datanodes' first retry after it: each
    heartbeated every `interval` s from a random phase until the leader died at 0, then
    retried after `backoff`'s waits (as `HeartbeatLoop` does)."""
    rng = random.Random(seed)
    after = []
    for _ in range(1000):
        at, failures = rng.random() * interval, 0
        while at < serving:
            at += backoff.delay(failures, rng)
            failures += 1
        after.append(at - serving)
    return after


def test_retries_after_a_takeover_spread_over_the_cap_not_bunched_at_its_start() -> None:
    """The design load's takeover (3 s interval, cap 1.5 s, the survivor serving ~4.7 s
    after the leader died): with full jitter at the cap, 55% of the datanodes send their
    first retry in the first third of the window (a wait spanning a moment is more likely
    a long one, yet the time left of it is uniform within it); with the default
    `cap_jitter` 36%, against 33% for a perfectly even spread. Nobody waits past the cap."""
    interval = 3.0
    shares = {}
    for jitter in (1.0, Backoff().cap_jitter):
        backoff = Backoff(base=0.1, cap=interval / 2, cap_jitter=jitter)
        share = []
        for seed in range(5):
            after = _first_retries_after(4.7, backoff, interval, seed)
            assert max(after) < backoff.cap
            share.append(sum(a < backoff.cap / 3 for a in after) / len(after))
        shares[jitter] = statistics.median(share)
    assert shares[1.0] == pytest.approx(0.55, abs=0.03)
    assert shares[Backoff().cap_jitter] == pytest.approx(0.36, abs=0.03)


def test_the_rng_decides_the_waits() -> None:
    backoff = Backoff()
    first = [backoff.delay(k, random.Random(7)) for k in range(8)]
    again = [backoff.delay(k, random.Random(7)) for k in range(8)]
    other = [backoff.delay(k, random.Random(8)) for k in range(8)]
    assert first == again and first != other


@pytest.mark.parametrize(("base", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_without_a_window_is_refused(base: float, cap: float) -> None:
    with pytest.raises(InvalidArgument):
        Backoff(base=base, cap=cap)


@pytest.mark.parametrize("cap_jitter", [0.0, -0.1, 1.5])
def test_a_cap_jitter_outside_zero_to_one_is_refused(cap_jitter: float) -> None:
    with pytest.raises(InvalidArgument, match="cap_jitter"):
        Backoff(cap_jitter=cap_jitter)


def test_a_negative_attempt_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        Backoff().ceiling(-1)
