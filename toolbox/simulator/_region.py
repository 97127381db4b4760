"""A simulated region: WAL writes to Kafka, a memtable, flushes to SST, replay and verification.

Thread model: `write` runs on the caller's thread, delivery reports on the writer's poll
thread, `flush` on the datanode's flusher (or the caller's) thread, `stat` on the
heartbeat thread. `_lock` guards the in-memory state; `_flush_lock` serializes flushes.

What the region reports follows DESIGN §1: `flushed_entry_id` moves only after the SST
and the manifest naming it are durable; `topic_latest_entry_id` is reported only while
nothing of the region is unflushed (memtable, flush in progress, or write in flight),
and only from a high watermark read after that was seen, so no entry the region still
needs is ever below it.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, Message

from metasrv.datanode import WalEntry
from metasrv.errors import Conflict, KafkaUnavailable
from toolbox.simulator._storage import Manifest, RegionStore, WalRow, digest
from toolbox.simulator._wal import WalWriter, entry_id_of, region_key, region_rows

logger = logging.getLogger(__name__)

OPTIONS = "options.json"


class RegionKilled(KafkaUnavailable):
    """The region's datanode was killed; the write was not acknowledged."""

    code = "region_killed"


@dataclass(frozen=True, slots=True)
class RegionReport:
    """One region's entry in a heartbeat (DESIGN §5)."""

    region_id: int
    """64-bit region id."""
    topic: str
    """Topic the region writes to."""
    flushed_entry_id: int
    """Every entry of the region <= this is in an SST."""
    topic_latest_entry_id: int | None
    """Topic's latest entry id when the region was seen with nothing unflushed; else None."""
    memtable_bytes: int
    """Bytes not yet flushed (memtable plus a flush in progress)."""
    manifest_version: int
    """Bumped on every flush."""

    def as_json(self) -> dict[str, object]:
        """The heartbeat wire form."""
        return {
            "region_id": self.region_id,
            "topic": self.topic,
            "flushed_entry_id": self.flushed_entry_id,
            "topic_latest_entry_id": self.topic_latest_entry_id,
            "memtable_bytes": self.memtable_bytes,
            "manifest_version": self.manifest_version,
        }


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What a restart of one region did."""

    region_id: int
    topic: str
    start_entry_id: int
    """First entry id replayed: metasrv's replay-start, or the manifest's flushed id + 1
    where that is higher (`metasrv.datanode.replay_from`)."""
    flushed_entry_id: int
    """Flushed entry id found in the manifest."""
    records_read: int
    """Records of the topic read during replay (all regions)."""
    replayed: int
    """Rows of this region replayed into the memtable."""
    from_archive: int = 0
    """Of `records_read`, those read from the WAL archive (below Kafka's log start)."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Whether every acknowledged row of a region is recovered."""

    region_id: int
    acknowledged: int
    """Rows the ledger says were acknowledged."""
    recovered_from_sst: int
    """Acknowledged rows found in SSTs."""
    recovered_from_memtable: int
    """Acknowledged rows found in the memtable (replayed, or written since the restart)."""
    replayed: int
    """Rows replayed from Kafka at the last restart."""
    missing: int
    """Acknowledged rows found nowhere (or with other content): must be 0."""
    missing_entry_ids: tuple[int, ...] = ()
    """The first few missing entry ids, for the error message."""

    @property
    def ok(self) -> bool:
        """True when nothing acknowledged is missing."""
        return self.missing == 0


class SimRegion:
    """One region hosted by a simulated datanode."""

    def __init__(
        self,
        region_id: int,
        topic: str,
        root: Path,
        writer: WalWriter,
        *,
        flush_threshold_bytes: int | None = None,
        on_flush_needed: Callable[[SimRegion], None] | None = None,
        advance_flushed_when_idle: bool = True,
    ) -> None:
        """Open (or create) the region stored in `root`.

        `flush_threshold_bytes`: memtable size above which the region asks for a flush
        (`on_flush_needed`, or an inline flush when None); None: flush only when told.
        `advance_flushed_when_idle`: see `_start_write_locked`; False gives a datanode that
        simply stops reporting `topic_latest_entry_id` when it writes again.
        """
        self.region_id = region_id
        self.advance_flushed_when_idle = advance_flushed_when_idle
        self.topic = topic
        self.flush_threshold_bytes = flush_threshold_bytes
        self._store = RegionStore(root)
        self._writer = writer
        self._on_flush_needed = on_flush_needed
        manifest = self._store.load_manifest()
        self.created = manifest is None
        """True when this call created the region (no manifest was stored)."""
        if manifest is None:
            manifest = Manifest(region_id, topic, -1, 0, ())
            self._store.commit_manifest(manifest)
            (root / OPTIONS).write_text(
                json.dumps({"flush_threshold_bytes": flush_threshold_bytes})
            )
        elif manifest.topic != topic or manifest.region_id != region_id:
            raise Conflict(
                f"region dir {root} holds region {manifest.region_id} on {manifest.topic}, "
                f"not {region_id} on {topic}"
            )
        removed = self._store.remove_orphans(manifest)
        if removed:
            logger.info("removed SSTs of an interrupted flush", extra={"files": removed})
        self._manifest = manifest
        self._incarnation = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._memtable: list[WalRow] = []
        self._memtable_bytes = 0
        self._flushing: list[WalRow] = []
        self._flushing_bytes = 0
        self._in_flight = 0
        self._writes_started = 0
        self._flush_requested = False
        self._topic_latest: int | None = None
        self._killed = False
        self._replay_due = not self.created
        """A reopened region is never idle before it replays its WAL: its unflushed entries
        are in Kafka, not yet in its memtable (a report of the topic's latest id for it
        would let a purge delete them)."""
        self._replayed = 0
        self.acknowledged = 0
        self.failed_writes = 0
        ledger = self._store.read_ledger()
        sst_max = max((r.seq for r in self._store.read_ssts(manifest)), default=-1)
        self._next_seq = max(max((e.seq for e in ledger), default=-1), sst_max) + 1
        self._store.open_ledger()

    @staticmethod
    def stored_options(root: Path) -> dict[str, object]:
        """Options saved when the region was created (used to reopen it after a crash)."""
        path = root / OPTIONS
        data: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
        return data

    @staticmethod
    def stored_manifest(root: Path) -> Manifest | None:
        """The manifest stored in `root`, if any."""
        return RegionStore(root).load_manifest()

    # --- writing ------------------------------------------------------------------------

    def write(self, payload: str) -> Future[int]:
        """Write one row to the WAL; the future resolves to its entry id once acknowledged."""
        future: Future[int] = Future()
        with self._lock:
            seq = self._start_write_locked(promote=False)
        if seq is None:
            # Leaving idleness: make the reported topic latest durable first (same lock order
            # as flush: flush lock, then state lock).
            with self._flush_lock, self._lock:
                seq = self._start_write_locked(promote=True)
                assert seq is not None
        value = json.dumps(
            {
                "region_id": self.region_id,
                "seq": seq,
                "incarnation": self._incarnation,
                "payload": payload,
            }
        ).encode()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            self._delivered(seq, value, future, err, msg)

        try:
            self._writer.produce(self.topic, region_key(self.region_id), value, delivered)
        except BaseException:
            with self._lock:
                self._in_flight -= 1
                self.failed_writes += 1
            raise
        return future

    def _start_write_locked(self, *, promote: bool) -> int | None:
        """Take a sequence number for a new write (caller holds `_lock`).

        While idle, the region reported `topic_latest_entry_id` T (its prunable id). When it
        writes again that report stops, and its prunable id would fall back to
        `flushed_entry_id` < T: a stat going backwards, and, after a purge to T, a false
        "log start above what the region needs". So before the first write after idleness
        the region records flushed_entry_id = T in its manifest, which is true by DESIGN §1:
        with nothing unflushed, every entry of the region <= T is in an SST. Returns None
        when that manifest write is needed and `promote` is False.
        """
        if self._killed:
            raise RegionKilled(f"region {self.region_id} is down")
        latest = self._topic_latest
        if self.advance_flushed_when_idle and latest is not None:
            old = self._manifest
            if latest > old.flushed_entry_id:
                if not promote:
                    return None
                new = Manifest(old.region_id, old.topic, latest, old.manifest_version + 1, old.ssts)
                self._store.commit_manifest(new)
                self._manifest = new
        seq = self._next_seq
        self._next_seq += 1
        self._in_flight += 1
        self._writes_started += 1
        self._topic_latest = None
        return seq

    def _delivered(
        self, seq: int, value: bytes, future: Future[int], err: KafkaError | None, msg: Message
    ) -> None:
        need_flush = False
        with self._lock:
            self._in_flight -= 1
            if self._killed:
                future.set_exception(RegionKilled(f"region {self.region_id} went down"))
                return
            if err is not None:
                self.failed_writes += 1
                future.set_exception(KafkaUnavailable(f"write to {self.topic}: {err.str()}"))
                return
            entry_id = entry_id_of(msg)
            # Ledger first: the acknowledgement exists once the ledger line reached the OS.
            self._store.record_ack(seq, entry_id, digest(value))
            self._memtable.append(WalRow(entry_id, seq, value))
            self._memtable_bytes += len(value)
            self.acknowledged += 1
            threshold = self.flush_threshold_bytes
            if (
                threshold is not None
                and self._memtable_bytes >= threshold
                and not self._flush_requested
            ):
                self._flush_requested = True
                need_flush = True
        future.set_result(entry_id)
        if need_flush:
            if self._on_flush_needed is not None:
                self._on_flush_needed(self)
            else:
                self.flush()

    # --- flushing -----------------------------------------------------------------------

    def flush(self) -> int | None:
        """Write the memtable to a new SST; return the new flushed entry id (None: nothing)."""
        with self._flush_lock:
            with self._lock:
                self._flush_requested = False
                if self._killed or not self._memtable:
                    return None
                rows, self._memtable = self._memtable, []
                self._flushing, self._flushing_bytes = rows, self._memtable_bytes
                self._memtable_bytes = 0
                old = self._manifest
            rows.sort(key=lambda r: r.entry_id)
            version = old.manifest_version + 1
            name = self._store.write_sst(version, rows)
            new = Manifest(
                region_id=old.region_id,
                topic=old.topic,
                flushed_entry_id=max(old.flushed_entry_id, rows[-1].entry_id),
                manifest_version=version,
                ssts=(*old.ssts, name),
            )
            with self._lock:
                if self._killed:
                    return None  # crashed mid-flush: the SST is an orphan, removed on reopen
            self._store.commit_manifest(new)
            with self._lock:
                self._manifest = new
                self._flushing, self._flushing_bytes = [], 0
            logger.debug(
                "flushed region",
                extra={
                    "region_id": self.region_id,
                    "rows": len(rows),
                    "flushed": rows[-1].entry_id,
                },
            )
            return new.flushed_entry_id

    # --- reporting ----------------------------------------------------------------------

    def idle_token(self) -> int | None:
        """A token if nothing of the region is unflushed now, else None (see `observe_latest`)."""
        with self._lock:
            # A killed region's memtable was lost, not flushed: it is never idle (a
            # heartbeat racing the crash must not report the topic's latest id for it).
            if self._killed or self._replay_due:
                return None
            if self._memtable or self._flushing or self._in_flight:
                return None
            return self._writes_started

    def observe_latest(self, token: int, latest_entry_id: int) -> None:
        """Record the topic's latest entry id, read after `idle_token` returned `token`.

        Taken only if no write started since: every later write gets a higher entry id,
        so the region needs nothing at or below `latest_entry_id`.
        """
        with self._lock:
            if self._killed or self._replay_due or self._writes_started != token:
                return
            if self._memtable or self._flushing:
                return
            if self._topic_latest is None or latest_entry_id > self._topic_latest:
                self._topic_latest = latest_entry_id

    def stat(self) -> RegionReport:
        """The region's heartbeat entry now."""
        with self._lock:
            return RegionReport(
                region_id=self.region_id,
                topic=self.topic,
                flushed_entry_id=self._manifest.flushed_entry_id,
                topic_latest_entry_id=self._topic_latest,
                memtable_bytes=self._memtable_bytes + self._flushing_bytes,
                manifest_version=self._manifest.manifest_version,
            )

    def unflushed_rows(self) -> list[WalRow]:
        """Acknowledged rows not yet durable in an SST: what the WAL must still hold."""
        with self._lock:
            return [*self._flushing, *self._memtable]

    def unflushed_entry_ids(self) -> list[int]:
        """Entry ids of `unflushed_rows()`."""
        return [r.entry_id for r in self.unflushed_rows()]

    @property
    def flushed_entry_id(self) -> int:
        """Every row of the region with entry id <= this is in an SST."""
        with self._lock:
            return self._manifest.flushed_entry_id

    # --- crash, replay, verification ----------------------------------------------------

    def kill(self) -> None:
        """Drop the in-memory state as a crash would (the memtable is lost)."""
        with self._lock:
            self._killed = True
            self._memtable, self._memtable_bytes = [], 0
            self._flushing, self._flushing_bytes = [], 0
            self._topic_latest = None
        with self._flush_lock:  # wait out a flush that was writing files
            pass
        self._store.close_ledger()

    def close(self) -> None:
        """Stop taking writes and close files (the memtable is not flushed)."""
        self.kill()

    def replay(
        self, start_entry_id: int, entries: Iterable[WalEntry], *, log_start: int | None = None
    ) -> RecoveryReport:
        """Rebuild the memtable from the WAL `entries` of the region's topic, read from
        `start_entry_id` on (`metasrv.datanode.replay_entries`: the archive's objects below
        Kafka's `log_start`, then Kafka).

        Raises what reading `entries` raises: `WalDataLoss` if neither Kafka nor the archive
        holds them.
        """
        below = 0

        def counted() -> Iterable[WalEntry]:
            nonlocal below
            for entry in entries:
                if log_start is not None and entry.entry_id < log_start:
                    below += 1
                yield entry

        rows, read = region_rows(counted(), self.region_id)
        with self._lock:
            flushed = self._manifest.flushed_entry_id
            fresh = [r for r in rows if r.entry_id > flushed]
            self._memtable = fresh + self._memtable
            self._memtable_bytes += sum(len(r.value) for r in fresh)
            self._replayed = len(fresh)
            self._replay_due = False
            if fresh:
                self._next_seq = max(self._next_seq, max(r.seq for r in fresh) + 1)
        logger.info(
            "replayed region",
            extra={"region_id": self.region_id, "start": start_entry_id, "rows": len(fresh)},
        )
        return RecoveryReport(
            region_id=self.region_id,
            topic=self.topic,
            start_entry_id=start_entry_id,
            flushed_entry_id=flushed,
            records_read=read,
            replayed=len(fresh),
            from_archive=below,
        )

    def verify(self) -> VerifyReport:
        """Check that every row the ledger says was acknowledged is in an SST or the memtable."""
        ledger = self._store.read_ledger()  # read first: anything acked later is in memory too
        with self._lock:
            manifest = self._manifest
            in_memory = {r.entry_id: digest(r.value) for r in (*self._flushing, *self._memtable)}
            replayed = self._replayed
        in_sst = {r.entry_id: digest(r.value) for r in self._store.read_ssts(manifest)}
        from_sst = from_mem = 0
        missing: list[int] = []
        for entry in ledger:
            if in_sst.get(entry.entry_id) == entry.digest:
                from_sst += 1
            elif in_memory.get(entry.entry_id) == entry.digest:
                from_mem += 1
            else:
                missing.append(entry.entry_id)
        return VerifyReport(
            region_id=self.region_id,
            acknowledged=len(ledger),
            recovered_from_sst=from_sst,
            recovered_from_memtable=from_mem,
            replayed=replayed,
            missing=len(missing),
            missing_entry_ids=tuple(missing[:10]),
        )
