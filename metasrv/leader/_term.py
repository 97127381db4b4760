"""A leadership term as the leader's loops see it: when it began, and whether its first
round is in.

A new term's stats start empty (DESIGN §2 invariant 3). Its first round is in once every
mapped region has reported in it: the leader has then heard from every region. Two loops
wait for it, each at most one of its own intervals from the term's start: the purge
ticker runs the term's first round then (not one `wal.auto_prune_interval` after the
election), and the checkpointer holds its writes until then (the kv's cores go to the
first reports, the term's costliest heartbeats). `LeaderView` begins a term each time it
forgets the last one (`Checkpointer.clear`).
"""

from __future__ import annotations

import time
from collections.abc import Sized
from typing import Protocol

FIRST_ROUND_CHECK = 0.1
"""Seconds between two looks at whether a term's first round is in. A look is two `len`
calls, nothing at ten a second; the purge ticker's first round then starts within a tenth
of a second of the last first report (the ticker looked every second, the checkpointer
every tenth; one value now, the checkpointer's)."""


class MappedRegions(Sized, Protocol):
    """The topic-region map as a term sees it: loaded, and how many regions it maps."""

    @property
    def loaded(self) -> bool: ...


class Term:
    """When this process's current leadership term began, and whether every mapped region
    has reported in it."""

    def __init__(self, region_map: MappedRegions, registry: Sized) -> None:
        self._region_map = region_map
        self._registry = registry
        self.number = 0
        """Terms begun so far (a loop that sees it change knows a new term began)."""
        self.began = float("-inf")
        """When the current term began (`time.monotonic`)."""

    def begin(self) -> None:
        """A new term begins now; its stats start empty."""
        self.number += 1
        self.began = time.monotonic()

    def every_region_reported(self) -> bool:
        """True once every mapped region has a stat in this term (no purge plans from a
        region it has not heard from)."""
        mapped = self._region_map
        return mapped.loaded and len(self._registry) >= len(mapped)

    def awaiting_first_round(self, within: float) -> bool:
        """True while the term is younger than `within` seconds and some mapped region
        has not reported in it yet."""
        return time.monotonic() < self.began + within and not self.every_region_reported()
