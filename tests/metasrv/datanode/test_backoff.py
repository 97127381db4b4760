"""Capped exponential backoff with full jitter: the bounds of every wait (pure)."""

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


@pytest.mark.parametrize("attempt", [0, 1, 3, 5, 40])
def test_every_wait_lies_in_zero_to_the_ceiling(attempt: int) -> None:
    backoff = Backoff(base=0.05, cap=2.0)
    rng = random.Random(attempt)
    delays = [backoff.delay(attempt, rng) for _ in range(5000)]
    ceiling = backoff.ceiling(attempt)
    assert all(0.0 <= d < ceiling for d in delays)
    assert backoff.delay(attempt, _Fixed(0.0)) == 0.0
    assert backoff.delay(attempt, _Fixed(0.999999)) == pytest.approx(ceiling * 0.999999)


def test_the_wait_is_uniform_over_the_whole_window_not_just_its_top() -> None:
    """Full jitter: mean ceiling/2, spread ceiling/sqrt(12) ("equal jitter" would be
    uniform over [ceiling/2, ceiling): mean 0.75 ceiling)."""
    backoff = Backoff(base=1.0, cap=1.0)
    delays = [backoff.delay(0, random.Random(seed)) for seed in range(4000)]
    assert statistics.fmean(delays) == pytest.approx(0.5, abs=0.03)
    assert statistics.pstdev(delays) == pytest.approx(1 / 12**0.5, abs=0.02)
    assert min(delays) < 0.01 and max(delays) > 0.99


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


def test_a_negative_attempt_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        Backoff().ceiling(-1)
