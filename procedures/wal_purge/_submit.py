"""Starting WAL purges: the manager that runs them, and one purge per topic."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from metasrv.errors import NotFound
from procedures import Procedure, ProcedureManager
from procedures.wal_purge._procedure import WalPurge
from procedures.wal_purge._services import PurgeServices

_SUBMIT_CONCURRENCY = 64


def purge_manager(
    services: PurgeServices, *other_kinds: type[Procedure[Any, PurgeServices]]
) -> ProcedureManager[PurgeServices]:
    """A procedure manager that runs `WalPurge` (and `other_kinds`) with `services`."""
    return ProcedureManager(
        services.procedure_store(),
        services.history,
        services.election,
        services.metrics,
        services.settings.procedure,
        services=services,
        kinds=[WalPurge, *other_kinds],
    )


async def submit_purges(
    manager: ProcedureManager[PurgeServices], topics: list[str] | None, *, reason: str
) -> list[str]:
    """Submit a WAL purge per topic (every topic with regions when None); return the
    procedure ids, in the order of `topics`.

    A topic that already has a purge in flight yields that procedure's id instead (its
    kv lock). Unknown topics raise `NotFound` before anything is submitted.
    """
    manager.require_leader()
    region_map = manager.services.region_map
    known = list(region_map.topics())
    if topics is None:
        # Topics without regions have nothing to purge (they would only be skipped).
        wanted = [t for t in known if region_map.regions_of(t)]
    else:
        known_set = set(known)
        wanted = list(dict.fromkeys(topics))
        missing = [t for t in wanted if t not in known_set]
        if missing:
            raise NotFound(
                f"unknown topics: {', '.join(missing[:20])}", details={"topics": missing}
            )
    gate = asyncio.Semaphore(_SUBMIT_CONCURRENCY)

    async def one(topic: str) -> str:
        async with gate:
            return await manager.submit(WalPurge.new(uuid.uuid4().hex, topic), reason=reason)

    return list(await asyncio.gather(*(one(t) for t in wanted)))
