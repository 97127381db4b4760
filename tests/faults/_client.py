"""A datanode's client of a metasrv cluster: the product's `DatanodeClient` over every
address of the cluster (a 421 followed to the leader it names, an unreachable or paused
process passed over, a new leader loading its map retried after a backoff), which also
keeps what each region told which leader, for the invariant monitor's report."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from metasrv import wire
from metasrv.datanode import Body, DatanodeClient


class ClusterClient(DatanodeClient):
    """`heartbeat` and `replay_start` against whichever metasrv leads."""

    def __init__(self, urls: Sequence[str], *, timeout: float = 3.0) -> None:
        super().__init__(urls, timeout=timeout)
        self._reports: dict[int, deque[tuple[float, str, Any]]] = {}

    def heartbeat(self, body: Body) -> wire.HeartbeatResponse:
        response = super().heartbeat(body)
        # Kept for diagnosing an invariant violation: what each region told which leader.
        now = time.time()
        regions = body.get("regions", ()) if isinstance(body, dict) else ()
        for region in regions:
            reports = self._reports.setdefault(region["region_id"], deque(maxlen=30))
            reports.append((now, self.current, region))
        return response

    def reports(self, region_id: int) -> list[tuple[float, str, Any]]:
        """The region's last heartbeat entries a metasrv answered: (time, url, entry)."""
        return list(self._reports.get(region_id, ()))
