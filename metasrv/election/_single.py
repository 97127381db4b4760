"""Single-process leaders: an in-memory SQLite kv (always the leader) and a SQLite kv file
(the leader while it holds the file's lock)."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from pathlib import Path
from typing import IO

from metasrv.election._lease import Listener, Listeners
from metasrv.errors import ConfigError
from metasrv.kv import Compare

logger = logging.getLogger(__name__)


class SingleLeader:
    """Always the leader: for an in-memory SQLite kv, which no other process can reach
    (and, with its file lock, for a SQLite file: `SqliteFileLeader`)."""

    def __init__(self, *, node_name: str, addr: str) -> None:
        self.node_name = node_name
        self.addr = addr
        self._leader = False
        self._listeners = Listeners()

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def term(self) -> int:
        return 1 if self._leader else 0

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._listeners.task

    async def start(self) -> None:
        if self._leader:
            return
        self._listeners.start()
        self._leader = True
        logger.info("single-process leader (SQLite kv, no election)")
        self._listeners.notify(True)

    async def stop(self) -> None:
        if self._leader:
            self._leader = False
            self._listeners.notify(False)
        await self._listeners.drain_and_stop()

    def leader_addr(self) -> str | None:
        return self.addr if self._leader else None

    def add_listener(self, callback: Listener) -> None:
        self._listeners.add(callback)

    def fence(self) -> list[Compare]:
        # Nothing to fence against: no other process can reach this store.
        return []


class SqliteFileLeader(SingleLeader):
    """The leader of a SQLite kv file, which one process serves: it holds an exclusive
    lock on `{file}.leader.lock` from `start` to `stop` (the kernel drops it when the
    process dies, even by SIGKILL), and a second process on the same file is refused.

    A lease row renewed through SQLite's single writer lock starved behind the daemon's
    own checkpoint batches when the process was saturated, and the busy single-node
    leader deposed itself (421/503 bursts); a file lock needs no writes to hold.
    Several metasrv processes need PostgreSQL or etcd."""

    def __init__(self, database: Path, *, node_name: str, addr: str) -> None:
        super().__init__(node_name=node_name, addr=addr)
        self.database = database
        self.lock_path = database.with_name(database.name + ".leader.lock")
        self._lock_file: IO[str] | None = None

    async def start(self) -> None:
        if self._lock_file is None:
            handle = open(self.lock_path, "a+")  # noqa: SIM115 (held until stop)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise ConfigError(
                    f"the SQLite kv file {self.database} is in use by "
                    f"{holder}: a SQLite file serves one metasrv process; run several on "
                    "PostgreSQL or etcd (kv.backend, kv.sql_url)"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"metasrv pid {os.getpid()} ({self.node_name})\n")
            handle.flush()
            self._lock_file = handle
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        handle, self._lock_file = self._lock_file, None
        if handle is not None:
            handle.close()  # releases the lock
