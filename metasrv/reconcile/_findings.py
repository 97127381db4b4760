"""What a reconcile run reports: finding kinds, severities, and the Parquet row schema."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from metasrv.wire import FindingKind, Severity

SEVERITY_RANK = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
"""Sort order: most urgent first."""

MAP_SCHEMA = pa.schema(
    [
        pa.field("region_id", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("node_id", pa.int64(), nullable=False),
        pa.field("checkpoint_entry_id", pa.int64()),
    ]
)
"""The topic-region map as the driver writes it: one row per `__topic_region` key."""

FINDINGS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("severity", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("region_id", pa.int64()),
        pa.field("message", pa.string(), nullable=False),
        pa.field("evidence", pa.string(), nullable=False),
    ]
)
"""Columns of the findings Parquet; `evidence` is a JSON object (text)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One inconsistency, with the facts that prove it."""

    kind: FindingKind
    """What is wrong."""
    severity: Severity
    """How urgent it is."""
    topic: str | None
    """Topic concerned (the mapped topic for region findings), if any."""
    region_id: int | None
    """Region concerned, if any."""
    message: str
    """One human sentence."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """The observed values the finding rests on."""

    @property
    def key(self) -> tuple[str, str | None, int | None]:
        """Identity of the finding across runs and engines."""
        return (self.kind.value, self.topic, self.region_id)

    def to_row(self) -> dict[str, Any]:
        """A row of `FINDINGS_SCHEMA`."""
        return {
            "kind": self.kind.value,
            "severity": self.severity.value,
            "topic": self.topic,
            "region_id": self.region_id,
            "message": self.message,
            "evidence": json.dumps(self.evidence, sort_keys=True),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Finding:
        """Inverse of `to_row`."""
        return cls(
            kind=FindingKind(row["kind"]),
            severity=Severity(row["severity"]),
            topic=row["topic"],
            region_id=None if row["region_id"] is None else int(row["region_id"]),
            message=row["message"],
            evidence=json.loads(row["evidence"]),
        )
