"""The forms a region's stored stat takes outside the stat table: one row (`StatRow`), new
values for a batch of rows (`RowValues`), and copied columns of many rows (`RowColumns`).
A null `topic_latest_entry_id` or `manifest_version` is `NULL` in a column, None in a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from metasrv.model import NULL


class StatRow(msgspec.Struct, frozen=True, gc=False):
    """One region's stat as read from the table (a `RegionStat` without its region id,
    which is the key it is stored under). The prunable entry id is stored precomputed
    (`metasrv.model.prunable_entry_id`)."""

    node_id: int
    topic: str
    flushed_entry_id: int
    topic_latest_entry_id: int | None
    memtable_bytes: int
    manifest_version: int | None
    received_at: float
    prunable_entry_id: int


@dataclass(slots=True)
class RowValues:
    """New values of some regions' rows, a column each, in the same order (what a
    heartbeat accepted a column at a time). `NULL` stands for a null."""

    ids: np.ndarray
    flushed: np.ndarray
    latest: np.ndarray
    memtable: np.ndarray
    manifest: np.ndarray
    prunable: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def or_null(values: list[int | None]) -> list[int]:
    """`values` with None as `NULL` (the list itself when it holds no None)."""
    if None in values:
        return [NULL if v is None else v for v in values]
    return values  # type: ignore[return-value]  # no None: checked above


def nullable(values: np.ndarray) -> list[int | None]:
    """A column as a list, `NULL` as None."""
    out: list[int | None] = values.tolist()
    if len(values) and (values == NULL).any():
        out = [None if v == NULL else v for v in out]
    return out


@dataclass(frozen=True, slots=True)
class RowColumns:
    """Copies of some rows' columns (`StatTable.columns`); `topic` indexes `names`."""

    names: list[str]
    ids: np.ndarray
    topic: np.ndarray
    node: np.ndarray
    flushed: np.ndarray
    latest: np.ndarray
    memtable: np.ndarray
    manifest: np.ndarray
    received: np.ndarray
    prunable: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def where(self, mask: np.ndarray) -> RowColumns:
        """The rows where `mask` is true."""
        return RowColumns(
            self.names,
            self.ids[mask],
            self.topic[mask],
            self.node[mask],
            self.flushed[mask],
            self.latest[mask],
            self.memtable[mask],
            self.manifest[mask],
            self.received[mask],
            self.prunable[mask],
        )
