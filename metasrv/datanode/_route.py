"""Which metasrv to send a request to: the routing rules as pure state, no I/O.

One `Attempt` sends a request at most once to each address, in this order:

1. the route's `current` address (the last one that served, or said it is loading);
2. a 421's `error.leader`, at once, unless this attempt already tried it or it was
   unreachable within the last `quarantine` seconds (a follower names the dead leader
   until its lease runs out);
3. after a 421 without a usable leader, or a connection failure, the next configured
   address in order that is not quarantined;
4. quarantined addresses only when no address answered at all in this attempt (with one
   address, it is always retried).

A 503 ends the attempt: that address is the leader loading its map, or one whose
dependency is away, and the next attempt starts there after a backoff. The sync and async
clients (`_client.py`) drive the same rules.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from metasrv.errors import InvalidArgument
from metasrv.wire import base_url_from_addr


class Route:
    """The addresses of a metasrv cluster and the one to try first."""

    def __init__(
        self,
        addrs: Sequence[str],
        *,
        quarantine: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        urls = list(dict.fromkeys(base_url_from_addr(a) for a in addrs))
        if not urls:
            raise InvalidArgument("a datanode needs at least one metasrv address")
        self.urls = urls
        """Every address known: the configured ones, then leaders learned from 421s."""
        self.current = urls[0]
        self.quarantine = quarantine
        self._clock = clock
        self._down: dict[str, float] = {}

    def attempt(self) -> Attempt:
        """A new attempt, starting at `current`."""
        return Attempt(self)

    def is_down(self, url: str) -> bool:
        """True when `url` failed to connect within the last `quarantine` seconds."""
        failed = self._down.get(url)
        return failed is not None and self._clock() - failed < self.quarantine

    def _learn(self, url: str) -> None:
        if url not in self.urls:
            self.urls.append(url)


class Attempt:
    """One try at a request across the cluster: `next()` until it is None or one served."""

    def __init__(self, route: Route) -> None:
        self._route = route
        self._tried: list[str] = []
        self._next: str | None = route.current
        self._answered = False
        self._over = False
        self._resume: str | None = None

    @property
    def tried(self) -> list[str]:
        """Addresses sent to, in order."""
        return list(self._tried)

    def next(self) -> str | None:
        """The address to send to now, or None: the attempt failed (back off, then retry)."""
        url = None if self._over else (self._next or self._rotate())
        self._next = None
        if url is None:
            self._over = True
            self._route.current = self._restart_point()
            return None
        self._tried.append(url)
        return url

    def served(self, url: str) -> None:
        """`url` answered the request (any answer other than 421 or 503)."""
        self._route.current = url
        self._route._down.pop(url, None)
        self._over = True

    def not_leader(self, url: str, leader: str | None) -> None:
        """`url` answered 421, naming `leader` (or no one)."""
        self._answered = True
        if not leader:
            return
        target = base_url_from_addr(leader)
        self._route._learn(target)
        if target not in self._tried and not self._route.is_down(target):
            self._next = target
            self._resume = target

    def loading(self, url: str) -> None:
        """`url` answered 503: retry it, after a backoff."""
        self._answered = True
        self._resume = url
        self._over = True

    def unreachable(self, url: str) -> None:
        """`url` refused the connection or timed out."""
        self._route._down[url] = self._route._clock()

    def _rotate(self) -> str | None:
        urls = self._route.urls
        last = self._tried[-1] if self._tried else self._route.current
        start = urls.index(last) + 1 if last in urls else 0
        fresh = [u for u in urls[start:] + urls[:start] if u not in self._tried]
        up = [u for u in fresh if not self._route.is_down(u)]
        if up:
            return up[0]
        if fresh and not self._answered:
            return fresh[0]
        return None

    def _restart_point(self) -> str:
        """Where the next attempt starts: the address that said it is (about to be) the
        leader, else the first address after the current one that is not quarantined."""
        route = self._route
        if self._resume is not None and not route.is_down(self._resume):
            return self._resume
        urls = route.urls
        start = urls.index(route.current) + 1 if route.current in urls else 0
        for url in urls[start:] + urls[:start]:
            if not route.is_down(url):
                return url
        return route.current
