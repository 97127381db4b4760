"""The fault suite's counters, printed as one line at the end of the session."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class FaultSummary:
    """What the suite did and found, over every test of the session."""

    faults: int = 0
    """Faults injected (process kills, pauses, service stops)."""
    resumed: int = 0
    """Procedures unfinished when their leader's term ended and finished by a later term."""
    verified: dict[tuple[str, int], int] = field(default_factory=dict)
    """Acknowledged rows verified after a recovery, per (cluster, region): the latest count
    (a region's ledger is cumulative, so the latest check covers every earlier row)."""
    lost: set[tuple[str, int, int]] = field(default_factory=set)
    """(cluster, region, entry id) of acknowledged rows not recovered, or deleted from Kafka
    while still unflushed."""
    lost_unnamed: int = 0
    """Rows reported missing beyond the ids a report names."""
    ran: bool = False
    """True once any fault test ran (the line is printed only then)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fault(self, count: int = 1) -> None:
        """Count injected faults."""
        with self._lock:
            self.faults += count

    def resumed_procedures(self, count: int) -> None:
        """Count procedures a later leader finished."""
        with self._lock:
            self.resumed += count

    def verified_rows(self, cluster: str, region_id: int, acknowledged: int) -> None:
        """Record a region's verified acknowledged rows."""
        with self._lock:
            key = (cluster, region_id)
            self.verified[key] = max(self.verified.get(key, 0), acknowledged)

    def lost_rows(self, cluster: str, region_id: int, entry_ids: list[int], total: int) -> None:
        """Record lost rows: the ids known, and how many there are in all."""
        with self._lock:
            self.lost.update((cluster, region_id, e) for e in entry_ids)
            self.lost_unnamed += max(0, total - len(entry_ids))

    @property
    def entries_verified(self) -> int:
        """Distinct acknowledged rows verified."""
        return sum(self.verified.values())

    @property
    def entries_lost(self) -> int:
        """Distinct rows lost (must be 0)."""
        return len(self.lost) + self.lost_unnamed

    def line(self) -> str:
        """The summary line."""
        return (
            f"faults: {self.faults} injected, {self.resumed} procedures resumed, "
            f"{self.entries_verified} entries verified, {self.entries_lost} entries lost"
        )
