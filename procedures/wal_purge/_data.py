"""The WAL purge's persisted data (`PurgeData`, with the regions it asked to flush,
`FlushTarget`) and its JSON form, as the procedure record holds it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class FlushTarget:
    """A region asked to flush so the topic can be cut further."""

    region_id: int
    node_id: int
    """Datanode hosting it (from its latest stat)."""
    prunable_entry_id: int
    """Its prunable entry id when chosen; a higher report means it flushed."""
    replay_bytes: int
    """Estimated bytes it would replay from the WAL when chosen."""


@dataclass(frozen=True, slots=True)
class PurgeData:
    """Persisted state of one WAL purge."""

    topic: str
    prune_point: int | None = None
    """P of the latest plan."""
    previous_pruned_entry_id: int | None = None
    """Marker when the latest plan was made."""
    log_start_offset: int | None = None
    """Kafka's log start offset when the latest plan was made."""
    high_watermark: int | None = None
    """Kafka's high watermark when the latest plan was made."""
    topic_id: str | None = None
    """Kafka's topic id when prepare planned (None: Kafka did not say). The purge step
    treats offsets of another topic id as a topic reset: a topic deleted and recreated
    during the purge, before any marker recorded its id, must not be cut with the plan
    of the old one."""
    flush: tuple[FlushTarget, ...] = ()
    """Flush candidates chosen by prepare."""
    flush_sent_at: float | None = None
    """Wall-clock time the flush instructions were queued."""
    flush_instructions: tuple[str, ...] = ()
    """Mailbox instruction ids."""
    flushed_regions: tuple[int, ...] = ()
    """Candidates that reported a higher prunable id before the wait ended."""
    target: int | None = None
    """The purge step's persisted intent: DeleteRecords offset and new marker."""
    low_watermark: int | None = None
    """Kafka's log start after the deletion."""

    def to_json(self) -> dict[str, Any]:
        # Through JSON once, so in-memory and stored forms are equal (tuples -> lists).
        out: dict[str, Any] = orjson.loads(orjson.dumps(dataclasses.asdict(self)))
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PurgeData:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in fields}
        values["flush"] = tuple(FlushTarget(**f) for f in raw.get("flush") or ())
        values["flush_instructions"] = tuple(raw.get("flush_instructions") or ())
        values["flushed_regions"] = tuple(raw.get("flushed_regions") or ())
        return cls(**values)
