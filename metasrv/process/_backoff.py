"""Capped exponential backoff, the one policy every retry in the product waits by.

After the k-th failure in a row (k = 0 for the first) the window is
`min(cap, base * 2**k)`. What is drawn from it is the `Jitter`:

- `FULL` (the datanode client): below the cap the wait is drawn uniformly from the
  whole window, `[0, window)` ("full jitter", the AWS Architecture Blog's "Exponential
  Backoff And Jitter", Marc Brooker, 2015), so datanodes that failed together part at
  once. At the cap it is drawn from `[cap * (1 - cap_jitter), cap)`, a period of about
  `cap` with a little jitter, for the moment a new leader starts serving: a datanode's
  next retry then lies anywhere in the next `cap` seconds with near-equal chance. With
  full jitter at the cap the waits average `cap / 2`, and the retry that falls due after
  a given moment is front-loaded (a wait spanning that moment is more likely a long one,
  but the time left of it is uniform within it): a thousand datanodes failing since a
  leader died send 55% of their first retries in the first third of the window, 36% with
  `cap_jitter = 0.1` (`tests/metasrv/datanode/test_backoff.py` simulates the design
  load's takeover).
- `SPREAD` (a procedure's step retries): `base * 2**k` times a factor drawn from
  `[0.5, 1.5)`, then capped: retries of procedures that failed together drift apart
  while each keeps about its doubling schedule.
- `NONE` (the leader's own loops: loading or following the topic-region map, creating
  the topic pool): the window itself. One process retries one thing; there is no herd
  to part, and a predictable pause reads better in its logs.

Either way no wait is longer than `cap` (`longest`).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Final

from metasrv.errors import InvalidArgument

_MAX_DOUBLINGS: Final = 64
"""Beyond this the ceiling is `cap` for any sane base; it keeps 2**k a float."""


class Jitter(enum.Enum):
    """How a wait is drawn from its window (module docstring)."""

    FULL = "full"
    SPREAD = "spread"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before retry number `attempt` (0-based)."""

    base: float = 0.1
    """Seconds: the ceiling of the first wait."""
    cap: float = 3.0
    """Seconds: no wait is longer."""
    cap_jitter: float = 0.1
    """`FULL` only: the part of `cap` the waits at the cap are spread over (1: full jitter
    there too)."""
    jitter: Jitter = Jitter.FULL

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base):
            raise InvalidArgument(
                f"backoff needs 0 < base <= cap (base={self.base}, cap={self.cap})"
            )
        if not 0 < self.cap_jitter <= 1:
            raise InvalidArgument(f"backoff needs 0 < cap_jitter <= 1, not {self.cap_jitter}")

    def ceiling(self, attempt: int) -> float:
        """`min(cap, base * 2**attempt)`: the window of retry `attempt`."""
        return min(self.cap, self._doubled(attempt))

    def longest(self, attempt: int) -> float:
        """The longest wait `delay(attempt)` can return."""
        if self.jitter is Jitter.SPREAD:
            return min(self.cap, self._doubled(attempt) * 1.5)
        return self.ceiling(attempt)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before retry `attempt`, drawn by `jitter` with `rng` (the module's
        generator when None)."""
        draw = (rng or random).random
        if self.jitter is Jitter.NONE:
            return self.ceiling(attempt)
        if self.jitter is Jitter.SPREAD:
            return min(self.cap, self._doubled(attempt) * (0.5 + draw()))
        ceiling = self.ceiling(attempt)
        if ceiling < self.cap:
            return draw() * ceiling
        spread = self.cap * self.cap_jitter
        return self.cap - spread + draw() * spread

    def _doubled(self, attempt: int) -> float:
        if attempt < 0:
            raise InvalidArgument(f"attempt must be >= 0, not {attempt}")
        return self.base * 2.0 ** min(attempt, _MAX_DOUBLINGS)
