"""Capped exponential backoff with full jitter.

After the k-th failure in a row (k = 0 for the first), wait a uniformly random time in
`[0, min(cap, base * 2**k))`: "full jitter" in the AWS Architecture Blog's "Exponential
Backoff And Jitter" (Marc Brooker, 2015). A thousand datanodes that lost their leader at
the same moment retry spread over the whole window instead of in one wave, and none
waits longer than `cap` between tries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from metasrv.errors import InvalidArgument

_MAX_DOUBLINGS: Final = 64
"""Beyond this the ceiling is `cap` for any sane base; it keeps 2**k a float."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before retry number `attempt` (0-based)."""

    base: float = 0.1
    """Seconds: the ceiling of the first wait."""
    cap: float = 3.0
    """Seconds: no wait is longer."""

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base):
            raise InvalidArgument(
                f"backoff needs 0 < base <= cap (base={self.base}, cap={self.cap})"
            )

    def ceiling(self, attempt: int) -> float:
        """`min(cap, base * 2**attempt)`: the longest wait before retry `attempt`."""
        if attempt < 0:
            raise InvalidArgument(f"attempt must be >= 0, not {attempt}")
        return min(self.cap, self.base * 2.0 ** min(attempt, _MAX_DOUBLINGS))

    def delay(self, attempt: int, rng: random.Random) -> float:
        """A wait drawn uniformly from `[0, ceiling(attempt))`."""
        return rng.random() * self.ceiling(attempt)
