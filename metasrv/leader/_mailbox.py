"""Instructions to datanodes, delivered in heartbeat responses (DESIGN §5).

metasrv never calls a datanode: it queues an instruction for the node, and the
instruction rides every heartbeat response to that node until it is applied or expires.
A `flush_regions` instruction is applied once every named region has reported a
`flushed_entry_id` above the one it had when the instruction was sent, or an empty
memtable (nothing left to flush). The purge procedure waits on that (`wait`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from metasrv.leader._registry import RegionRegistry
from metasrv.metrics import Metrics

FLUSH_REGIONS = "flush_regions"
"""The one instruction kind."""

_KEEP_FINISHED = 4096
"""Finished instructions remembered for `state()`; older ones are forgotten."""


class InstructionState(StrEnum):
    """Where an instruction is in its life."""

    PENDING = "pending"
    APPLIED = "applied"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction for one datanode."""

    id: str
    """Unique id (hex)."""
    kind: str
    """Always `flush_regions` today."""
    node_id: int
    """Datanode it is addressed to."""
    region_ids: tuple[int, ...]
    """Regions to flush."""
    created_at: float
    """Monotonic-clock time it was queued."""
    expires_at: float
    """Monotonic-clock time after which it is dropped unapplied."""

    def to_json(self) -> dict[str, Any]:
        """The wire form of DESIGN §5: `{"id", "kind", "region_ids"}`."""
        return {"id": self.id, "kind": self.kind, "region_ids": list(self.region_ids)}


class FlushReport(Protocol):
    """What `observe` reads of a region's accepted stat (a `StatRow` or a `RegionStat`)."""

    @property
    def flushed_entry_id(self) -> int: ...

    @property
    def memtable_bytes(self) -> int: ...


class _Pending:
    __slots__ = ("baseline", "event", "instruction", "wire")

    def __init__(self, instruction: Instruction, baseline: dict[int, int]) -> None:
        self.instruction = instruction
        self.wire = instruction.to_json()
        # Region -> flushed_entry_id when sent; shrinks as regions report a flush.
        self.baseline = baseline
        self.event: asyncio.Event | None = None


class Mailbox:
    """Per-datanode queues of instructions, observed against heartbeat stats."""

    def __init__(
        self,
        registry: RegionRegistry,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._clock = clock
        self._by_node: dict[int, dict[str, _Pending]] = {}
        self._by_id: dict[str, _Pending] = {}
        self._finished: dict[str, InstructionState] = {}

    def send_flush(self, node_id: int, region_ids: Iterable[int], *, ttl: float) -> str:
        """Queue a `flush_regions` instruction for `node_id`; return its id."""
        ids = tuple(dict.fromkeys(region_ids))
        now = self._clock()
        instruction = Instruction(
            id=uuid.uuid4().hex,
            kind=FLUSH_REGIONS,
            node_id=node_id,
            region_ids=ids,
            created_at=now,
            expires_at=now + ttl,
        )
        baseline: dict[int, int] = {}
        for region_id in ids:
            stat = self._registry.get(region_id)
            baseline[region_id] = stat.flushed_entry_id if stat is not None else -1
        entry = _Pending(instruction, baseline)
        self._by_node.setdefault(node_id, {})[instruction.id] = entry
        self._by_id[instruction.id] = entry
        if self._metrics is not None:
            self._metrics.flush_instructions.inc()
        if not ids:
            self._finish(entry, InstructionState.APPLIED)
        return instruction.id

    def pending(self, node_id: int) -> list[Instruction]:
        """Instructions still to deliver to `node_id` (expired ones are dropped here)."""
        queue = self._by_node.get(node_id)
        if not queue:
            return []
        self._expire(queue)
        return [p.instruction for p in queue.values()]

    def pending_wire(self, node_id: int) -> list[dict[str, Any]]:
        """`pending` in wire form, for the heartbeat response (no per-call encoding)."""
        queue = self._by_node.get(node_id)
        if not queue:
            return []
        self._expire(queue)
        return [p.wire for p in queue.values()]

    def has_pending(self, node_id: int) -> bool:
        """True when `node_id` has instructions not yet applied (one dict lookup)."""
        return bool(self._by_node.get(node_id))

    def observe(self, node_id: int, stats: Mapping[int, FlushReport]) -> list[str]:
        """Mark regions of `node_id`'s instructions flushed per `stats`; return applied ids.

        `stats` is what this heartbeat reported (region id -> accepted stat); only the
        node's own pending instructions are examined, so a node with none costs one lookup.
        """
        queue = self._by_node.get(node_id)
        if not queue:
            return []
        applied: list[str] = []
        for entry in list(queue.values()):
            baseline = entry.baseline
            for region_id in [r for r in baseline if r in stats]:
                stat = stats[region_id]
                if stat.flushed_entry_id > baseline[region_id] or stat.memtable_bytes == 0:
                    del baseline[region_id]
            if not baseline:
                self._finish(entry, InstructionState.APPLIED)
                applied.append(entry.instruction.id)
        self._expire(queue)
        return applied

    def state(self, instruction_id: str) -> InstructionState | None:
        """PENDING, APPLIED, EXPIRED, or None for an unknown (or long-forgotten) id."""
        entry = self._by_id.get(instruction_id)
        if entry is not None:
            if entry.instruction.expires_at <= self._clock():
                self._finish(entry, InstructionState.EXPIRED)
                return InstructionState.EXPIRED
            return InstructionState.PENDING
        return self._finished.get(instruction_id)

    def unflushed(self, instruction_id: str) -> tuple[int, ...]:
        """Regions of a pending instruction that have not reported a flush yet."""
        entry = self._by_id.get(instruction_id)
        return tuple(entry.baseline) if entry is not None else ()

    async def wait(self, instruction_id: str, timeout: float) -> InstructionState | None:
        """Wait until the instruction is applied or expires, or `timeout` seconds pass.

        Returns the state at that moment (PENDING on timeout).
        """
        entry = self._by_id.get(instruction_id)
        if entry is None:
            return self._finished.get(instruction_id)
        if entry.event is None:
            entry.event = asyncio.Event()
        remaining = entry.instruction.expires_at - self._clock()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(entry.event.wait(), max(0.0, min(timeout, remaining)))
        return self.state(instruction_id)

    def clear(self) -> None:
        """Drop every pending instruction (leadership change); waiters see EXPIRED."""
        for entry in list(self._by_id.values()):
            self._finish(entry, InstructionState.EXPIRED)
        self._by_node.clear()

    def _expire(self, queue: dict[str, _Pending]) -> None:
        now = self._clock()
        for entry in [e for e in queue.values() if e.instruction.expires_at <= now]:
            self._finish(entry, InstructionState.EXPIRED)

    def _finish(self, entry: _Pending, state: InstructionState) -> None:
        instruction = entry.instruction
        self._by_id.pop(instruction.id, None)
        queue = self._by_node.get(instruction.node_id)
        if queue is not None:
            queue.pop(instruction.id, None)
            if not queue:
                del self._by_node[instruction.node_id]
        self._finished[instruction.id] = state
        while len(self._finished) > _KEEP_FINISHED:
            del self._finished[next(iter(self._finished))]
        if entry.event is not None:
            entry.event.set()
