"""The last blocking verdict of each topic's archive check (`_coverage.py`), kept by the
process for the plan views: they show it until a check passes, and never ask the store."""

from __future__ import annotations

import threading

from procedures.wal_purge._plan import NotArchived


class ArchiveVerdicts:
    """The last blocking verdict of each topic's archive check in this process (None once a
    check passed). Written by the purge step, read by the plan views."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocked: dict[str, NotArchived] = {}

    def record(self, topic: str, verdict: NotArchived | None) -> None:
        with self._lock:
            if verdict is None:
                self._blocked.pop(topic, None)
            else:
                self._blocked[topic] = verdict

    def get(self, topic: str) -> NotArchived | None:
        with self._lock:
            return self._blocked.get(topic)

    def blocked(self) -> dict[str, NotArchived]:
        with self._lock:
            return dict(self._blocked)
