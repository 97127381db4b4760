"""Which metasrv a load generator's datanode sends to, and when it retries: the policy of
the product's datanode client (`metasrv.datanode`: `_route.py` and its `Backoff`) kept as
plain state, cheap enough for a thousand datanodes on one thread of `_load_gen.py`.

An attempt sends a heartbeat at most once to each address, starting at `current`:

- a 421 naming another leader goes there at once, unless this attempt tried it already or
  it was unreachable within the last `QUARANTINE` seconds (a follower names a dead leader
  until its lease runs out);
- a refused, reset or timed-out connection sets the address aside for `QUARANTINE`
  seconds and the attempt goes on to the next address not set aside; a 421 naming no
  usable leader goes on the same way;
- a 503 (a leader loading its map) or any other answer ends the attempt there.

An attempt that ends without a 200 is retried after the product's backoff
(`metasrv.datanode.Backoff`, with `base = min(0.1, interval / 2)` and `cap = interval / 2`,
as the product's heartbeat loop has it): after the k-th failed attempt in a row, a wait
drawn from `[0, min(cap, base * 2**k))` below the cap and from `[0.9 cap, cap)` at it (its
default `cap_jitter`); a 200 resets `k`. The 200 that ends a run of failed attempts is
followed by a wait drawn from `[interval/2, 3*interval/2)`, a new phase in the interval,
as the product's heartbeat loop does.
"""

from __future__ import annotations

import random
import time

from metasrv.datanode import Backoff

Addr = tuple[str, int]

QUARANTINE = 5.0
"""Seconds an address that failed to connect is not gone back to (metasrv.datanode's)."""


class Failover:
    """One datanode's addresses and retry state. Each method returns the seconds to wait
    before the next send (0: at once) and leaves the address to send to in `current`."""

    def __init__(
        self,
        addrs: list[Addr],
        interval: float,
        rng: random.Random,
        cap_jitter: float = Backoff().cap_jitter,
    ) -> None:
        self.addrs = list(dict.fromkeys(addrs))
        self.current = self.addrs[0]
        self.interval = interval
        self.backoff = Backoff(min(0.1, interval / 2), interval / 2, cap_jitter)
        self.rng = rng
        self.failures = 0
        """Attempts in a row that ended without a 200."""
        self._down: dict[Addr, float] = {}
        self._tried: list[Addr] = [self.current]
        self._answered = False
        self._resume: Addr | None = None

    def served(self) -> float | None:
        """`current` answered 200: the next heartbeat goes there, on schedule (None), or
        after the returned wait when this 200 ends a run of failed attempts."""
        self._down.pop(self.current, None)
        recovered = self.failures > 0
        self.failures = 0
        self._new_attempt()
        if recovered:
            return self.interval * (0.5 + self.rng.random())
        return None

    def not_leader(self, named: Addr | None) -> float:
        """`current` answered 421 naming `named` (None: no leader known)."""
        self._answered = True
        if named is not None:
            if named not in self.addrs:
                self.addrs.append(named)
            if named not in self._tried and not self._is_down(named):
                self._resume = named
                return self._go(named)
        return self._rotate()

    def loading(self) -> float:
        """`current` answered 503 (or another non-200): back off, then try it again."""
        self._answered = True
        self._resume = self.current
        return self._back_off()

    def unreachable(self) -> float:
        """`current` refused, reset or timed out the connection."""
        self._down[self.current] = time.monotonic()
        return self._rotate()

    def _is_down(self, addr: Addr) -> bool:
        failed = self._down.get(addr)
        return failed is not None and time.monotonic() - failed < QUARANTINE

    def _go(self, addr: Addr) -> float:
        self.current = addr
        self._tried.append(addr)
        return 0.0

    def _rotate(self) -> float:
        addrs = self.addrs
        start = addrs.index(self.current) + 1
        fresh = [a for a in addrs[start:] + addrs[:start] if a not in self._tried]
        up = [a for a in fresh if not self._is_down(a)]
        if up:
            return self._go(up[0])
        if fresh and not self._answered:
            return self._go(fresh[0])
        return self._back_off()

    def _back_off(self) -> float:
        resume = self._resume
        if resume is None or self._is_down(resume):
            addrs = self.addrs
            start = addrs.index(self.current) + 1
            ring = addrs[start:] + addrs[:start]
            resume = next((a for a in ring if not self._is_down(a)), self.current)
        self.current = resume
        delay = self.backoff.delay(self.failures, self.rng)
        self.failures += 1
        self._new_attempt()
        return delay

    def _new_attempt(self) -> None:
        self._tried = [self.current]
        self._answered = False
        self._resume = None
