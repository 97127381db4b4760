"""A simulated region's own durable storage: manifest, SST files and the acknowledgement ledger.

Layout under the region directory:

- `manifest.json`: `{"region_id", "topic", "flushed_entry_id", "manifest_version", "ssts"}`,
  replaced atomically (write, fsync, rename, fsync dir) after the SST it names is durable.
- `sst_{version:08d}.jsonl`: one JSON row per line (`entry_id`, `seq`, `value`), fsynced.
  An SST not named by the manifest is the leftover of a flush cut short; it is ignored
  and removed on open (its rows are above `flushed_entry_id`, so replay brings them back).
- `ledger.jsonl`: one line per row the region acknowledged to its writer (`seq`, `entry_id`,
  `digest`). It is the test oracle, not part of the region: it survives a crash (each line
  reaches the OS before the acknowledgement is counted) so `verify` can check recovery.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MANIFEST = "manifest.json"
LEDGER = "ledger.jsonl"


def digest(value: bytes) -> str:
    """Short content digest of a WAL record value (recovery compares content, not just ids)."""
    return hashlib.blake2b(value, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class WalRow:
    """One row of a region: a WAL record plus the entry id Kafka gave it."""

    entry_id: int
    """Kafka offset of the record in partition 0 of the region's topic."""
    seq: int
    """Per-region sequence number written in the record."""
    value: bytes
    """The record value (a JSON row)."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """The durable state of a region's storage."""

    region_id: int
    """64-bit region id."""
    topic: str
    """Topic the region writes its WAL to."""
    flushed_entry_id: int
    """Every row of the region with entry id <= this is in an SST (-1: none)."""
    manifest_version: int
    """Bumped on every flush."""
    ssts: tuple[str, ...]
    """SST file names, oldest first."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One acknowledged row, as recorded when the acknowledgement was given."""

    seq: int
    """Per-region sequence number."""
    entry_id: int
    """Kafka offset the delivery report gave."""
    digest: str
    """`digest(value)`."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RegionStore:
    """Files of one region in `root` (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._ledger: IO[str] | None = None

    # --- manifest and SSTs -------------------------------------------------------------

    def load_manifest(self) -> Manifest | None:
        """The committed manifest, or None for a region never opened here."""
        path = self.root / MANIFEST
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return Manifest(
            region_id=int(data["region_id"]),
            topic=str(data["topic"]),
            flushed_entry_id=int(data["flushed_entry_id"]),
            manifest_version=int(data["manifest_version"]),
            ssts=tuple(data["ssts"]),
        )

    def commit_manifest(self, manifest: Manifest) -> None:
        """Replace the manifest atomically and durably."""
        body = json.dumps(
            {
                "region_id": manifest.region_id,
                "topic": manifest.topic,
                "flushed_entry_id": manifest.flushed_entry_id,
                "manifest_version": manifest.manifest_version,
                "ssts": list(manifest.ssts),
            }
        )
        tmp = self.root / (MANIFEST + ".tmp")
        with tmp.open("w") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.root / MANIFEST)
        _fsync_dir(self.root)

    def write_sst(self, version: int, rows: Iterable[WalRow]) -> str:
        """Write rows to a new fsynced SST file; return its name (not yet in the manifest)."""
        name = f"sst_{version:08d}.jsonl"
        with (self.root / name).open("w") as fh:
            for row in rows:
                fh.write(
                    json.dumps(
                        {"entry_id": row.entry_id, "seq": row.seq, "value": row.value.decode()}
                    )
                )
                fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(self.root)
        return name

    def read_ssts(self, manifest: Manifest) -> Iterator[WalRow]:
        """Every row in the SSTs the manifest names."""
        for name in manifest.ssts:
            with (self.root / name).open() as fh:
                for line in fh:
                    data = json.loads(line)
                    yield WalRow(
                        entry_id=int(data["entry_id"]),
                        seq=int(data["seq"]),
                        value=str(data["value"]).encode(),
                    )

    def remove_orphans(self, manifest: Manifest | None) -> list[str]:
        """Delete SST files the manifest does not name (flushes cut short by a crash)."""
        keep = set(manifest.ssts) if manifest else set()
        removed = []
        for path in sorted(self.root.glob("sst_*.jsonl")):
            if path.name not in keep:
                path.unlink()
                removed.append(path.name)
        return removed

    # --- ledger -------------------------------------------------------------------------

    def open_ledger(self) -> None:
        """Open the ledger for appending (line buffered: each line reaches the OS at once)."""
        if self._ledger is None:
            self._ledger = (self.root / LEDGER).open("a", buffering=1)

    def record_ack(self, seq: int, entry_id: int, value_digest: str) -> None:
        """Append one acknowledged row. Must return before the acknowledgement counts."""
        if self._ledger is None:
            raise RuntimeError("ledger is not open")
        self._ledger.write(f"{seq} {entry_id} {value_digest}\n")

    def close_ledger(self) -> None:
        """Close the ledger file (idempotent)."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    def read_ledger(self) -> list[LedgerEntry]:
        """Every acknowledged row, in acknowledgement order.

        A torn last line (the process died mid-write) is ignored: that acknowledgement
        was never given.
        """
        path = self.root / LEDGER
        if not path.exists():
            return []
        text = path.read_text()
        lines = text.split("\n")
        # The last piece is "" after a complete line, or a torn line: drop it either way.
        entries = []
        for line in lines[:-1]:
            seq, entry_id, value_digest = line.split()
            entries.append(LedgerEntry(int(seq), int(entry_id), value_digest))
        return entries
