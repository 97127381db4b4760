"""The WAL archive in the fault suite: its own object store, archiver processes, and the checks.

- `SuiteObjectStore`: the suite's own S3Proxy (`toolbox.stack`'s S3 service in the suite's
  state dir, port `S3_PORT`), which the suite may stop, SIGSTOP and restart; the development
  stack's server is never touched. It shares the stack's downloaded jar when there is one.
- `ArchiverProcess`: one `metasrv archive -c FILE` child (optionally paused at a test hook,
  `METASRV_ARCHIVER_PAUSE_AT`), killed with SIGKILL or stopped with SIGTERM.
- `ArchiveCheck`: what must hold of the archive while faults happen and after they heal:
  - invariant 10, sampled with the monitor: Kafka's log start of every topic is covered by
    the bucket, [0, log start) with no gap (the log start is read before the listing, and
    objects are only ever added, so a hit is a real deletion of something not archived);
  - `covered`: each topic's objects hold [0, committed offset of the archive group) with no
    gap (the offset read before the listing: an archiver commits only a verified object);
  - `recoverable`: every acknowledged row of every region is read back, with its content,
    from the archive's objects below Kafka's log start and Kafka from the log start on,
    through the product's replay (`metasrv.datanode.replay_entries`); with a gap below the
    log start (invariant 10 broken) the rows it lost are counted in the summary line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from metasrv import wire
from metasrv.archive import (
    ArchivedRange,
    Coverage,
    ObjectStore,
    covering,
    decode_object,
    parse_object_key,
    topic_prefix,
)
from metasrv.datanode import WalEntry, replay_entries
from metasrv.errors import InvalidArgument, WalDataLoss
from metasrv.kafka import KafkaAdmin
from metasrv.model import PartitionOffsets
from metasrv.settings import ArchiveSettings
from tests.faults._summary import FaultSummary
from toolbox.simulator import (
    RegionStore,
    SimDatanode,
    SimRegion,
    digest,
    free_port,
    log_records,
    metasrv_argv,
    region_key,
    render_config,
)
from toolbox.stack import (
    S3PROXY_VERSION,
    S3Endpoint,
    StackConfig,
    s3_endpoint_of,
    service_pid,
    start_service,
    stop_service,
)

S3_PORT = 29196
"""The suite's own S3Proxy, beside its brokers (29192-29194) and controller (29195); below
32768 for the same reason (docs/faults.md)."""
PAUSE_ENV = "METASRV_ARCHIVER_PAUSE_AT"
LISTINGS = 5
"""Listings of a topic's objects before a gap in them counts (`ArchiveCheck.coverage`)."""


class SuiteObjectStore:
    """The suite's own S3Proxy: started for the session, stopped, paused and restarted by tests."""

    def __init__(self, state_dir: Path) -> None:
        self.cfg = StackConfig.from_env(state_dir=state_dir, s3_port=S3_PORT)
        self.endpoint: S3Endpoint = s3_endpoint_of(self.cfg)
        self.paused = False

    def up(self) -> None:
        """Continue a paused server, start a stopped one (installed from the stack's jar)."""
        self.resume()
        jar = self.cfg.state_dir / "s3" / f"s3proxy-{S3PROXY_VERSION}.jar"
        shared = StackConfig.from_env().state_dir / "s3" / jar.name
        if not jar.exists() and shared.exists():
            jar.parent.mkdir(parents=True, exist_ok=True)
            jar.symlink_to(shared)
        start_service(self.cfg, "s3")

    def stop(self) -> None:
        """SIGTERM (then SIGKILL) the server."""
        self.resume()
        stop_service(self.cfg, "s3")

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel and never answered."""
        pid = service_pid(self.cfg, "s3")
        assert pid is not None, "the suite's S3 server is not running"
        os.kill(pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT (a no-op unless paused)."""
        pid = service_pid(self.cfg, "s3")
        if self.paused and pid is not None:
            os.kill(pid, signal.SIGCONT)
        self.paused = False

    def archive_section(self, prefix: str, group: str) -> dict[str, Any]:
        """`[wal.archive]` of a cluster archiving under `prefix` with the consumer `group`.
        Small objects, written at most a second after their first entry, so purges (bounded
        by the group's committed offset) follow the writes closely; retention keeps all."""
        return {
            "enabled": True,
            "endpoint": self.endpoint.endpoint,
            "bucket": self.endpoint.bucket,
            "prefix": prefix,
            "access_key_id": self.endpoint.access_key_id,
            "secret_access_key": self.endpoint.secret_access_key,
            "consumer_group": group,
            "object_max_bytes": "64KB",
            "object_max_delay": "1s",
            "retention": "0s",
        }


class ArchiverProcess:
    """One `metasrv archive -c FILE` of a cluster; its JSON-line log in `workdir`."""

    def __init__(self, name: str, wal: dict[str, Any], archive: dict[str, Any], workdir: Path):
        self.name = name
        self.port = free_port()
        self.config = workdir / f"{name}.toml"
        self.log = workdir / f"{name}.log"
        sections = {"wal": wal, "wal.archive": archive, "http": {"addr": f"127.0.0.1:{self.port}"}}
        self.config.write_text(render_config(sections))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, pause_at: str | None = None) -> None:
        """Start it (paused at the test hook `pause_at` when given)."""
        env = {k: v for k, v in os.environ.items() if k != PAUSE_ENV}
        if pause_at is not None:
            env[PAUSE_ENV] = pause_at
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                metasrv_argv("archive", "-c", str(self.config), "--store-wait", "30"),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM: it leaves its group and exits; its exit code (None if it never ran)."""
        if not self.alive:
            return None if self.proc is None else self.proc.returncode
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def readyz(self) -> dict[str, Any] | None:
        """Its `/readyz` answer (200 or 503), None while it does not answer."""
        url = f"http://127.0.0.1:{self.port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=3) as answer:
                body: dict[str, Any] = json.loads(answer.read())
                return body
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
            return body
        except OSError:
            return None

    def assigned(self) -> set[str] | None:
        """Its topics once it is ready, else None."""
        state = self.readyz()
        return set(state["assigned"]) if state and state["ready"] else None

    def logged(self, msg: str) -> list[dict[str, Any]]:
        """Its log records whose message starts with `msg`."""
        return [record for _, record in log_records(self.log, msg)]


class _CachedStore(ObjectStore):
    """An `ObjectStore` that keeps what it read: an object's key names its range, and a
    range's content is fixed by the log, so a key read once reads the same ever after."""

    def __init__(self, settings: ArchiveSettings) -> None:
        super().__init__(settings, timeout=3.0, max_attempts=1)
        self._bodies: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self._lock:
            body = self._bodies.get(key)
        if body is None:
            body = super().get(key)
            with self._lock:
                self._bodies[key] = body
        return body


class ArchiveCheck:
    """The archive's invariants of one cluster (module docstring)."""

    def __init__(self, cluster: str, archive: dict[str, Any], kafka: str) -> None:
        self.cluster = cluster
        self.settings = ArchiveSettings.model_validate(archive)
        self.group = self.settings.consumer_group
        self.kafka = kafka
        self.store = _CachedStore(self.settings)
        self._admin = KafkaAdmin(kafka, request_timeout=5.0)
        self.relisted = 0
        """Listings repeated because one left existing objects out (`coverage`)."""

    def close(self) -> None:
        self.store.close()
        self._admin.close()

    def ranges(self, topic: str) -> list[ArchivedRange]:
        """The archived ranges of `topic` one listing of the bucket names."""
        prefix = self.settings.prefix
        found = []
        for obj in self.store.list(topic_prefix(prefix, topic)):
            with contextlib.suppress(InvalidArgument):
                found.append(parse_object_key(prefix, obj.key))
        return found

    def coverage(self, topic: str, start: int, end: int) -> Coverage:
        """`covering` of [start, end) by `topic`'s objects, over up to `LISTINGS` listings.

        S3Proxy's filesystem backend leaves existing objects out of a listing made while
        another object of the same directory is written (seen here: ~1 listing in 8 under
        a stream of puts). Objects are never deleted during a test, so the union of
        listings still holds only objects that exist: a gap that every listing shows is
        real, and one that another listing fills was the server's omission (counted in
        `relisted`)."""
        seen: set[ArchivedRange] = set()
        found = Coverage(())
        for attempt in range(LISTINGS):
            seen.update(self.ranges(topic))
            found = covering(seen, start, end)
            if found.covered:
                self.relisted += attempt
                return found
        return found

    def committed(self, topics: list[str]) -> dict[str, int | None]:
        """The archive group's committed offset on each topic (None: none yet)."""
        found: dict[str, int | None] = {}
        for topic, answer in self._admin.committed_offsets([self.group], topics).items():
            if isinstance(answer, Exception):
                raise answer
            found[topic] = answer.get(self.group)
        return found

    def log_starts(self, topics: list[str]) -> dict[str, int]:
        """Kafka's log start offset of each topic."""
        return {t: o.log_start_offset for t, o in self._admin.offsets(topics).items()}

    def sample(self, offsets: dict[str, PartitionOffsets]) -> list[str]:
        """Invariant 10 on `offsets` (read before this call): [0, log start) archived."""
        found = []
        for topic, off in offsets.items():
            if off.log_start_offset == 0:
                continue
            coverage = self.coverage(topic, 0, off.log_start_offset)
            if not coverage.covered:
                found.append(
                    f"{topic}: Kafka deleted below {off.log_start_offset}, the archive lacks "
                    f"entries {coverage.gap} (invariant 10)"
                )
        return found

    def covered(self, topics: list[str]) -> dict[str, int]:
        """Each topic's committed offset, checked to be archived from 0 with no gap."""
        committed = self.committed(topics)  # before the listing: see the module docstring
        problems, ends = [], {}
        for topic in topics:
            end = committed[topic] or 0
            ends[topic] = end
            coverage = self.coverage(topic, 0, end)
            if not coverage.covered:
                problems.append(f"{topic}: committed {end}, entries {coverage.gap} not archived")
        assert not problems, "\n".join(problems)
        return ends

    def recoverable(self, datanodes: list[SimDatanode], summary: FaultSummary) -> int:
        """Every acknowledged row of every region, read back from the archive below Kafka's
        log start and Kafka above it; returns the rows verified, records the missing ones."""
        ledgers: dict[str, dict[int, dict[int, str]]] = {}
        for datanode in datanodes:
            for region_id, path in datanode.region_dirs().items():
                manifest = SimRegion.stored_manifest(path)
                if manifest is None:
                    continue
                # Read before the topic: every row acknowledged so far is below the high
                # watermark the replay reads next.
                acked = {e.entry_id: e.digest for e in RegionStore(path).read_ledger()}
                ledgers.setdefault(manifest.topic, {})[region_id] = acked
        verified = 0
        problems = []
        for topic, regions in sorted(ledgers.items()):
            found = self._replay(topic, {region_key(r): r for r in regions})
            for region_id, acked in regions.items():
                rows = found.get(region_id, {})
                missing = sorted(e for e, d in acked.items() if rows.get(e) != d)
                summary.verified_rows(self.cluster, region_id, len(acked))
                verified += len(acked)
                if missing:
                    summary.lost_rows(self.cluster, region_id, missing[:100], len(missing))
                    problems.append(
                        f"region {region_id} on {topic}: {len(missing)} acknowledged rows "
                        f"neither archived nor in Kafka, e.g. {missing[:10]}"
                    )
        assert not problems, "\n".join(problems)
        return verified

    def _replay(self, topic: str, regions: dict[bytes, int]) -> dict[int, dict[int, str]]:
        """Region id -> entry id -> digest of the rows of `regions` (by record key) in the
        whole topic: the archive's objects covering [0, log start), then Kafka. A purge that
        moves the log start during the read makes Kafka's part fail (`auto.offset.reset=
        error`): read again from the new log start; any other loss is raised."""
        for _ in range(5):
            log_start = self.log_starts([topic])[topic]
            try:
                return self._replay_from(topic, regions, log_start)
            except WalDataLoss:
                if self.log_starts([topic])[topic] == log_start:
                    raise
        raise AssertionError(f"{topic}: the log start moved under five replays in a row")

    def _replay_from(
        self, topic: str, regions: dict[bytes, int], log_start: int
    ) -> dict[int, dict[int, str]]:
        coverage = self.coverage(topic, 0, log_start)
        entries: Iterable[WalEntry]
        if not coverage.covered:
            # Invariant 10 broken: read what the archive does hold below the log start, then
            # Kafka, so the rows lost are counted one by one (`recoverable`).
            answer = wire.ReplayStart(
                region_id=0, topic=topic, start_entry_id=log_start, log_start_offset=log_start
            )
            entries = itertools.chain(
                self._archived_below(topic, log_start),
                replay_entries(answer, kafka=self.kafka, timeout=60.0),
            )
        else:
            chain = [
                wire.ArchivedObject(
                    bucket=self.settings.bucket,
                    key=r.key(self.settings.prefix),
                    first_entry_id=r.first_entry_id,
                    last_entry_id=r.last_entry_id,
                )
                for r in coverage.objects
            ]
            answer = wire.ReplayStart(
                region_id=0,
                topic=topic,
                start_entry_id=0,
                log_start_offset=log_start,
                archive=chain or None,
            )
            entries = replay_entries(answer, kafka=self.kafka, store=self.store, timeout=60.0)
        rows: dict[int, dict[int, str]] = {}
        for entry in entries:
            region_id = regions.get(entry.key or b"")
            if region_id is not None:
                rows.setdefault(region_id, {})[entry.entry_id] = digest(entry.value or b"")
        return rows

    def _archived_below(self, topic: str, end: int) -> Iterator[WalEntry]:
        """The entries below `end` of every object of `topic` one listing names."""
        for found in sorted(self.ranges(topic)):
            if found.first_entry_id < end:
                for record in decode_object(self.store.get(found.key(self.settings.prefix))):
                    if record.entry_id < end:
                        yield WalEntry(record.entry_id, record.key, record.value)


class Archivers:
    """The archiver processes of one cluster, each started under a fresh name."""

    def __init__(self, wal: dict[str, Any], archive: dict[str, Any], workdir: Path) -> None:
        self.wal = wal
        self.archive = archive
        self.workdir = workdir
        self.started: list[ArchiverProcess] = []

    def start(self, name: str, pause_at: str | None = None) -> ArchiverProcess:
        """A new archiver `name-<n>` (paused at the test hook `pause_at` when given)."""
        process = ArchiverProcess(
            f"{name}-{len(self.started)}", self.wal, self.archive, self.workdir
        )
        process.start(pause_at)
        self.started.append(process)
        return process

    def running(self) -> list[ArchiverProcess]:
        """Those alive."""
        return [p for p in self.started if p.alive]

    def stop_all(self) -> None:
        """SIGTERM every running one (each leaves the group: no session timeout to wait)."""
        for process in self.running():
            process.stop()

    def kill_all(self) -> None:
        """SIGKILL every running one."""
        for process in self.running():
            process.kill()
