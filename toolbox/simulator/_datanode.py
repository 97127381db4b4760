"""A simulated datanode: hosts regions, heartbeats to the metasrv, obeys flush instructions.

Its metasrv side is `metasrv.datanode`, as a database's would be: `DatanodeClient` finds
the leader (421s followed, 503s and unreachable addresses retried) and asks replay
starts, `replay_entries` replays (the WAL archive's objects metasrv names, then Kafka), and
`HeartbeatLoop` heartbeats, retries after jittered backoff and hands new flush
instructions to the flusher.

Threads: the WAL writer's poll thread (delivery reports), the heartbeat loop's thread, one
flusher thread (auto-flushes and `flush_regions` instructions). `kill()` is a crash:
memtables are dropped, queued records are discarded, nothing is flushed. `restart()`
reopens every region found in the data dir, asks the metasrv where to replay from, and
replays; `verify()` then checks every acknowledged row is recovered.
"""

from __future__ import annotations

import enum
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from metasrv import wire
from metasrv.archive import ObjectStore
from metasrv.datanode import DatanodeClient, HeartbeatLoop, replay_entries, replay_from
from metasrv.errors import InvalidArgument, KafkaUnavailable
from metasrv.kafka import KafkaAdmin
from metasrv.model import PartitionOffsets
from metasrv.settings import ArchiveSettings
from toolbox.simulator._region import RecoveryReport, SimRegion, VerifyReport
from toolbox.simulator._wal import Tee, WalWriter, replay_config

logger = logging.getLogger(__name__)

_REGION_DIR = re.compile(r"^region_(\d+)$")
"""Seconds a restarting region waits for a replay start below Kafka's log start to move
(a purge in flight) before it reports WAL loss."""


class _Default(enum.Enum):
    TOKEN = 0


DEFAULT = _Default.TOKEN
"""Marker for "use the datanode's default flush threshold"."""


class MetasrvLink(Protocol):
    """What a datanode asks of its metasrv client: `DatanodeClient`, or a test's own."""

    def heartbeat(self, body: Any, /) -> wire.HeartbeatResponse: ...

    def replay_start(self, region_id: int, /) -> int: ...

    def close(self) -> None: ...


def _link(client: MetasrvLink | None) -> MetasrvLink:
    if client is None:
        raise InvalidArgument("restart without a metasrv needs replay_start")
    return client


@dataclass(frozen=True, slots=True)
class Rejection:
    """A region the metasrv refused in a heartbeat."""

    region_id: int
    reason: str
    """Reason the metasrv gave."""


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    """What one heartbeat round trip did."""

    leader: str | None
    """Leader the metasrv named."""
    flush_instructions: tuple[int, ...]
    """Region ids the metasrv asked to flush (queued for the flusher)."""
    rejected: tuple[Rejection, ...]
    """Regions refused."""


class SimDatanode:
    """A datanode hosting simulated regions in `data_dir` (one sub-directory per region)."""

    def __init__(
        self,
        node_id: int,
        metasrv_url: str | Sequence[str] | None,
        token: str | None,
        kafka_bootstrap: str,
        data_dir: str | Path,
        *,
        heartbeat_interval: float = 1.0,
        flush_threshold_bytes: int | None = 256 * 1024,
        replay_timeout: float = 60.0,
        tee: Tee | None = None,
        advance_flushed_when_idle: bool = True,
        archive: ArchiveSettings | None = None,
    ) -> None:
        """`metasrv_url`: one metasrv address or several; None: no heartbeats (Kafka-only
        use), and `restart` then needs `replay_start`.

        `archive`: the WAL archive's bucket (`[wal.archive]`), read when metasrv's replay
        start is below Kafka's log start; None or disabled: no archive, such a start is
        WAL data loss.

        `tee` sees every record this datanode writes (benchmarks copy them to twin topics).
        `advance_flushed_when_idle`: see `SimRegion` (False: DESIGN-literal regions that just
        stop reporting `topic_latest_entry_id` when they write again).
        """
        self.node_id = node_id
        self.kafka_bootstrap = kafka_bootstrap
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.heartbeat_interval = heartbeat_interval
        self.flush_threshold_bytes = flush_threshold_bytes
        self.replay_timeout = replay_timeout
        self.tee = tee
        self.advance_flushed_when_idle = advance_flushed_when_idle
        self.client: MetasrvLink | None = (
            DatanodeClient(metasrv_url, token=token, timeout=5.0) if metasrv_url else None
        )
        self.archive = ObjectStore(archive) if archive is not None and archive.enabled else None
        self.regions: dict[int, SimRegion] = {}
        self.rejections: list[Rejection] = []
        self.flushes_instructed = 0
        self.heartbeats_sent = 0
        self._heartbeats = HeartbeatLoop(
            self._send,
            self.heartbeat_payload,
            interval=heartbeat_interval,
            on_flush=self._flush_instructed,
            name=f"dn{node_id}-heartbeat",
        )
        self._admin = KafkaAdmin(kafka_bootstrap)
        self._writer: WalWriter | None = None
        self._flush_queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fatal: BaseException | None = None
        self._alive = False

    # --- lifecycle ----------------------------------------------------------------------

    def _writer_or_open(self) -> WalWriter:
        if self._writer is None:
            self._writer = WalWriter(
                self.kafka_bootstrap, client_id=f"sim-dn-{self.node_id}", tee=self.tee
            )
        return self._writer

    def add_region(
        self,
        region_id: int,
        topic: str,
        *,
        flush_threshold_bytes: int | _Default | None = DEFAULT,
        observe: bool = True,
    ) -> SimRegion:
        """Open (or create) a region on this datanode. It is reported from the next heartbeat.

        `flush_threshold_bytes` None: the region flushes only when the metasrv asks.
        A new region (`observe`) is given the topic's latest entry id at once (observe_idle).
        An existing region dir is reopened without replay: use `restart` for that.
        """
        threshold = (
            self.flush_threshold_bytes
            if isinstance(flush_threshold_bytes, _Default)
            else flush_threshold_bytes
        )
        region = SimRegion(
            region_id,
            topic,
            self.data_dir / f"region_{region_id}",
            self._writer_or_open(),
            flush_threshold_bytes=threshold,
            on_flush_needed=self._request_flush,
            advance_flushed_when_idle=self.advance_flushed_when_idle,
        )
        self.regions[region_id] = region
        if observe and region.created:
            self.observe_idle([region])
        return region

    def start(self) -> None:
        """Start the heartbeat and flusher threads (idempotent while running)."""
        if self._alive:
            return
        self._alive = True
        self._stop.clear()
        self._flush_queue = queue.SimpleQueue()
        self._writer_or_open()
        self._threads = [
            threading.Thread(
                target=self._guard(self._flush_loop), name=f"dn{self.node_id}-flush", daemon=True
            )
        ]
        for thread in self._threads:
            thread.start()
        if self.client is not None:
            self._heartbeats.start()

    def _guard(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except BaseException as exc:  # surfaced by check(); a dead loop must not go unseen
                logger.exception("datanode %s loop died", self.node_id)
                self._fatal = exc

        return run

    def check(self) -> None:
        """Raise the error that killed a background loop, if any."""
        if self._fatal is not None:
            raise self._fatal
        self._heartbeats.check()

    @property
    def alive(self) -> bool:
        """False between `kill()` and `restart()`."""
        return self._alive

    def _stop_threads(self) -> None:
        self._stop.set()
        self._heartbeats.stop()
        self._flush_queue.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._threads = []

    def stop(self) -> None:
        """Graceful stop: deliver queued records, stop the loops (memtables are not flushed)."""
        self._stop_threads()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for region in self.regions.values():
            region.close()
        self._alive = False

    def close(self) -> None:
        """Stop and release clients."""
        self.stop()
        if self.client is not None:
            self.client.close()
        if self.archive is not None:
            self.archive.close()
        self._admin.close()

    def kill(self) -> None:
        """Crash: memtables lost, undelivered records dropped, loops stopped, nothing flushed."""
        self._alive = False
        for region in self.regions.values():
            region.kill()
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        self._stop_threads()
        self.regions = {}
        logger.info("datanode %s killed", self.node_id)

    def region_dirs(self) -> dict[int, Path]:
        """Region directories present in the data dir."""
        found = {}
        for path in sorted(self.data_dir.iterdir()):
            match = _REGION_DIR.match(path.name)
            if match and path.is_dir() and SimRegion.stored_manifest(path) is not None:
                found[int(match.group(1))] = path
        return found

    def restart(
        self, replay_start: Callable[[int], int] | None = None, *, start: bool = True
    ) -> list[RecoveryReport]:
        """Reopen every region stored in the data dir and replay its WAL.

        The replay start comes from the metasrv (`GET /v1/regions/{id}/replay-start`,
        with the WAL archive's objects to read first when the start is below Kafka's log
        start) unless `replay_start` is given (then Kafka alone). A start neither Kafka nor
        the archive holds raises `WalDataLoss`. Heartbeats resume only after every region
        replayed (`start=False`: not at all).
        """
        if self._alive or self.regions:
            self.kill()
        self._fatal = None
        if replay_start is None and self.client is None:
            raise InvalidArgument("restart without a metasrv needs replay_start")
        reports = []
        for region_id, path in self.region_dirs().items():
            manifest = SimRegion.stored_manifest(path)
            assert manifest is not None
            options = SimRegion.stored_options(path)
            threshold = options.get("flush_threshold_bytes", self.flush_threshold_bytes)
            region = self.add_region(
                region_id,
                manifest.topic,
                flush_threshold_bytes=threshold if isinstance(threshold, int) else None,
                observe=False,
            )
            reports.append(self._replay(region, replay_start))
        self.observe_idle()  # before any write: see observe_idle
        if start:
            self.start()
        return reports

    def _replay(
        self, region: SimRegion, replay_start: Callable[[int], int] | None
    ) -> RecoveryReport:
        """Replay one region from the replay start metasrv answers (or `replay_start`
        gives), once, or from its own flushed entry id + 1 when that is higher
        (`replay_from`: the answer may come from a stat that lags the manifest, and a purge
        after the region's next report may delete below it).

        metasrv's answer (`DatanodeClient.replay_answer`, retried while no metasrv serves)
        names the WAL archive's objects when the start is below Kafka's log start and the
        archive holds the range: they are read first (`replay_entries`), then Kafka. A start
        below the log start that the archive does not hold is WAL data loss
        (`auto.offset.reset=error`): metasrv moves a topic's marker before it deletes, so a
        region that needs nothing below the log start is never sent below it, and the
        datanode does not ask twice."""
        flushed = region.flushed_entry_id
        if replay_start is None and isinstance(self.client, DatanodeClient):
            answer = self.client.replay_answer(region.region_id)
        else:
            asked = replay_start or _link(self.client).replay_start
            start = replay_from(asked(region.region_id), flushed)
            answer = wire.ReplayStart(
                region_id=region.region_id, topic=region.topic, start_entry_id=start
            )
        entries = replay_entries(
            answer,
            kafka=replay_config(self.kafka_bootstrap),
            store=self.archive,
            flushed_entry_id=flushed,
            timeout=self.replay_timeout,
        )
        start = replay_from(answer.start_entry_id, flushed)
        return region.replay(start, entries, log_start=answer.log_start_offset)

    def verify(self) -> list[VerifyReport]:
        """Check every region's acknowledged rows are recovered (call after `restart`)."""
        return [region.verify() for region in self.regions.values()]

    # --- flushing -----------------------------------------------------------------------

    def _request_flush(self, region: SimRegion) -> None:
        self._flush_queue.put(region.region_id)

    def flush(self, region_ids: Iterable[int] | None = None) -> dict[int, int | None]:
        """Flush regions now on the caller's thread (all when None)."""
        ids = list(self.regions) if region_ids is None else list(region_ids)
        return {rid: self.regions[rid].flush() for rid in ids if rid in self.regions}

    def _flush_loop(self) -> None:
        while True:
            region_id = self._flush_queue.get()
            if region_id is None or self._stop.is_set():
                return
            region = self.regions.get(region_id)
            if region is not None:
                region.flush()

    # --- heartbeats ---------------------------------------------------------------------

    @property
    def heartbeat_errors(self) -> int:
        """Heartbeats of the loop that no metasrv answered."""
        return self._heartbeats.errors

    @property
    def last_error(self) -> BaseException | None:
        """Why the loop's last failed heartbeat failed."""
        return self._heartbeats.last_error

    def observe_idle(self, regions: list[SimRegion] | None = None) -> dict[str, PartitionOffsets]:
        """Give every idle region the topic's latest entry id; return the offsets read.

        Done on every heartbeat, and when a region opens or restarts before it takes writes:
        its first write then makes that id its durable flushed id (SimRegion), so a region
        that opens on a purged topic never reports a flushed id below the log start.
        """
        regions = list(self.regions.values()) if regions is None else regions
        tokens = {r.region_id: r.idle_token() for r in regions}
        topics = sorted({r.topic for r in regions})
        # Read after the idle tokens were taken: see SimRegion.observe_latest.
        offsets: dict[str, PartitionOffsets] = {}
        try:
            offsets = self._admin.offsets(topics) if topics else {}
        except KafkaUnavailable as exc:
            # Still report: flushed ids stay true; idle regions keep their last observation.
            logger.warning("datanode %s: no topic offsets: %s", self.node_id, exc)
        for region in regions:
            token = tokens[region.region_id]
            if token is not None and region.topic in offsets:
                region.observe_latest(token, offsets[region.topic].high_watermark - 1)
        return offsets

    def heartbeat_payload(self) -> dict[str, Any]:
        """Build the DESIGN §5 heartbeat body (reads the topics' high watermarks)."""
        regions = list(self.regions.values())
        topics = sorted({r.topic for r in regions})
        offsets = self.observe_idle(regions)
        counters = self._writer.counters() if self._writer is not None else {}
        topic_entries = []
        for topic in topics:
            c = counters.get(topic)
            latest = offsets[topic].high_watermark - 1 if topic in offsets else -1
            topic_entries.append(
                {
                    "topic": topic,
                    "latest_entry_id": max(latest, c.latest_entry_id if c else -1),
                    "record_size": c.record_size if c else 0,
                    "record_num": c.record_num if c else 0,
                }
            )
        return {
            "node_id": self.node_id,
            "addr": None,
            "regions": [r.stat().as_json() for r in regions],
            "topics": topic_entries,
        }

    def _send(self, body: Any) -> wire.HeartbeatResponse:
        """Send one heartbeat; log and keep the regions the metasrv refused."""
        if self.client is None:
            raise InvalidArgument("this datanode has no metasrv")
        response = self.client.heartbeat(body)
        self.heartbeats_sent += 1
        rejected = [Rejection(r.region_id, r.reason) for r in response.rejected]
        for rejection in rejected:
            logger.warning(
                "metasrv rejected region %s: %s",
                rejection.region_id,
                rejection.reason,
                extra={"node_id": self.node_id},
            )
        self.rejections.extend(rejected)
        return response

    def _flush_instructed(self, region_ids: tuple[int, ...]) -> list[int]:
        """Queue a new flush instruction's hosted regions for the flusher."""
        hosted = []
        for region_id in region_ids:
            if region_id in self.regions:
                hosted.append(region_id)
            else:
                logger.warning("asked to flush region %s, not hosted here", region_id)
        for region_id in hosted:
            self._flush_queue.put(region_id)
        self.flushes_instructed += len(hosted)
        return hosted

    def heartbeat_once(self) -> HeartbeatOutcome:
        """Send one heartbeat now (one attempt across the metasrv addresses) and act on the
        answer: new flush instructions queued, rejections logged."""
        response = self._send(self.heartbeat_payload())
        flush_ids = [
            region_id
            for region_ids in self._heartbeats.dispatch(response, None)
            for region_id in self._flush_instructed(region_ids)
        ]
        return HeartbeatOutcome(
            leader=response.leader,
            flush_instructions=tuple(flush_ids),
            rejected=tuple(Rejection(r.region_id, r.reason) for r in response.rejected),
        )
