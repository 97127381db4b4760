"""A datanode's client of a metasrv cluster: every address, and the one that led last.

`MetasrvClient` talks to one address and follows a 421 once. A datanode of a cluster
whose leader may be killed or paused must also move on when its metasrv stops
answering; this client keeps one `MetasrvClient` per address and tries the named leader,
then the others, within one call. The simulator's datanodes use it through the two
calls they make (`heartbeat`, `replay_start`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from metasrv import wire
from metasrv.errors import MetasrvError, NotLeader, Unavailable
from metasrv.wire import MetasrvClient, base_url_from_addr

T = TypeVar("T")


class ClusterClient(MetasrvClient):
    """`heartbeat` and `replay_start` against whichever metasrv leads."""

    def __init__(self, urls: Sequence[str], *, timeout: float = 3.0) -> None:
        if not urls:
            raise ValueError("a cluster client needs at least one address")
        super().__init__(urls[0], timeout=timeout, follow_leader=False)
        self._order = [base_url_from_addr(u) for u in urls]
        self._clients = {
            u: MetasrvClient(u, timeout=timeout, follow_leader=False) for u in self._order
        }
        self._current = self._order[0]
        self._reports: dict[int, deque[tuple[float, str, Any]]] = {}

    @property
    def current(self) -> str:
        """The address the next call tries first."""
        return self._current

    def _next(self, url: str) -> str:
        return self._order[(self._order.index(url) + 1) % len(self._order)]

    def _call(self, fn: Callable[[MetasrvClient], T]) -> T:
        url = self._current
        last: MetasrvError | None = None
        for _ in range(2 * len(self._order)):
            try:
                result = fn(self._clients[url])
            except NotLeader as exc:
                last = exc
                named = base_url_from_addr(exc.leader) if exc.leader else None
                url = named if named in self._clients and named != url else self._next(url)
                continue
            except Unavailable as exc:
                # Unreachable, timed out (a paused process), or a new leader still loading.
                last = exc
                url = self._next(url)
                continue
            self._current = url
            return result
        assert last is not None
        raise last

    def heartbeat(self, payload: Mapping[str, Any]) -> wire.HeartbeatResponse:
        response = self._call(lambda c: c.heartbeat(payload))
        # Kept for diagnosing an invariant violation: what each region told which leader.
        now = time.time()
        for region in payload.get("regions", ()):
            reports = self._reports.setdefault(region["region_id"], deque(maxlen=30))
            reports.append((now, self._current, region))
        return response

    def reports(self, region_id: int) -> list[tuple[float, str, Any]]:
        """The region's last accepted-by-transport heartbeat entries: (time, url, entry)."""
        return list(self._reports.get(region_id, ()))

    def replay_start(self, region_id: int) -> int:
        return self._call(lambda c: c.replay_start(region_id))

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        super().close()
