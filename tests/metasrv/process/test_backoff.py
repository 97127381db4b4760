"""The one backoff's policies other than the datanode's full jitter (that one:
tests/metasrv/datanode/test_backoff.py): no jitter, and +-50% spread (pure)."""

from __future__ import annotations

import random

import pytest

from metasrv.errors import InvalidArgument
from metasrv.process import Backoff, Jitter


def test_without_jitter_the_wait_is_the_window_doubling_to_the_cap() -> None:
    backoff = Backoff(base=0.25, cap=5.0, jitter=Jitter.NONE)
    waits = [backoff.delay(k) for k in range(8)]
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert [backoff.longest(k) for k in range(8)] == waits


def test_spread_waits_lie_within_half_to_one_and_a_half_of_the_doubling() -> None:
    backoff = Backoff(base=0.5, cap=30.0, jitter=Jitter.SPREAD)
    rng = random.Random(7)
    for k in range(12):
        doubled = 0.5 * 2**k
        waits = [backoff.delay(k, rng) for _ in range(200)]
        assert all(min(30.0, 0.5 * doubled) <= w <= min(30.0, 1.5 * doubled) for w in waits)
        assert max(waits) <= backoff.longest(k) == min(30.0, 1.5 * doubled)
    # Capped after the spread: far past the cap every wait is the cap.
    assert {backoff.delay(40, rng) for _ in range(50)} == {30.0}


def test_spread_draws_the_factor_over_the_whole_range() -> None:
    backoff = Backoff(base=1.0, cap=100.0, jitter=Jitter.SPREAD)
    waits = [backoff.delay(0, random.Random(seed)) for seed in range(2000)]
    assert min(waits) < 0.52 and max(waits) > 1.48
    assert sum(waits) / len(waits) == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("jitter", list(Jitter))
def test_no_policy_waits_past_the_cap_or_takes_a_negative_attempt(jitter: Jitter) -> None:
    backoff = Backoff(base=0.1, cap=2.0, jitter=jitter)
    rng = random.Random(3)
    assert all(0.0 <= backoff.delay(k, rng) <= 2.0 for k in range(70) for _ in range(20))
    with pytest.raises(InvalidArgument, match="attempt"):
        backoff.delay(-1, rng)
