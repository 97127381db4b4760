"""Which metasrv a load generator's datanode sends to, and when it retries: the product
datanode client's own routing (`metasrv.datanode.Route`, one `Attempt` per heartbeat) and
backoff (`metasrv.datanode.Backoff`), driven from `_load_gen.py`'s event loop instead of the
client's blocking calls, so a thousand datanodes share one thread.

The rules are `Route`'s: an attempt sends at most once to each address, follows a 421's
named leader at once (unless tried already in the attempt or unreachable within the last
`QUARANTINE` seconds), moves past a refused, reset or timed-out connection, and ends at a
503 (or any other answer). An attempt that ends without a 200 is retried after the
product's backoff with `base = min(0.1, interval / 2)` and `cap = interval / 2`, as the
product's heartbeat loop (`metasrv.datanode.HeartbeatLoop`) has it; the 200 that ends a
run of failed attempts is followed by a wait drawn from `[interval/2, 3*interval/2)`, a
new phase in the interval, as that loop does.
"""

from __future__ import annotations

import random

from _raw_http import addr_of

from metasrv.datanode import Backoff, Route

Addr = tuple[str, int]

QUARANTINE = 5.0
"""Seconds an address that failed to connect is not gone back to (the client's default)."""


class Failover:
    """One datanode's route and retry state. Each method returns the seconds to wait
    before the next send (0: at once) and leaves the address to send to in `current`."""

    def __init__(
        self,
        addrs: list[Addr],
        interval: float,
        rng: random.Random,
        cap_jitter: float = Backoff().cap_jitter,
    ) -> None:
        self.route = Route([f"{host}:{port}" for host, port in addrs], quarantine=QUARANTINE)
        self.interval = interval
        self.backoff = Backoff(min(0.1, interval / 2), interval / 2, cap_jitter)
        self.rng = rng
        self.failures = 0
        """Attempts in a row that ended without a 200."""
        self._addrs: dict[str, Addr] = {}
        self._attempt = self.route.attempt()
        self._url = self._first()
        self.current = self._addr(self._url)

    def served(self) -> float | None:
        """`current` answered 200: the next heartbeat goes there, on schedule (None), or
        after the returned wait when this 200 ends a run of failed attempts."""
        self._attempt.served(self._url)
        recovered = self.failures > 0
        self.failures = 0
        self._attempt = self.route.attempt()
        self._url = self._first()
        self.current = self._addr(self._url)
        if recovered:
            return self.interval * (0.5 + self.rng.random())
        return None

    def not_leader(self, named: str | None) -> float:
        """`current` answered 421 naming `named` (`host:port`; None: no leader known)."""
        self._attempt.not_leader(self._url, named)
        return self._advance()

    def loading(self) -> float:
        """`current` answered 503 (or another non-200): back off, then try it again."""
        self._attempt.loading(self._url)
        return self._advance()

    def unreachable(self) -> float:
        """`current` refused, reset or timed out the connection."""
        self._attempt.unreachable(self._url)
        return self._advance()

    def _advance(self) -> float:
        """The attempt's next address at once, or, when it is over, a new attempt after
        the backoff."""
        url = self._attempt.next()
        delay = 0.0
        if url is None:
            delay = self.backoff.delay(self.failures, self.rng)
            self.failures += 1
            self._attempt = self.route.attempt()
            url = self._first()
        self._url = url
        self.current = self._addr(url)
        return delay

    def _first(self) -> str:
        url = self._attempt.next()
        assert url is not None  # a new attempt starts at the route's current address
        return url

    def _addr(self, url: str) -> Addr:
        addr = self._addrs.get(url)
        if addr is None:
            addr = self._addrs[url] = addr_of(url)
        return addr
