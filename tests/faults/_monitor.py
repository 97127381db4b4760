"""The purge's safety invariants, sampled continuously while faults happen.

Each sample reads, in this order:
1. every topic's `pruned_entry_id` marker from etcd: it must never move backwards
   (invariant 5) and must not exceed the partition's high watermark (invariant 6);
2. every topic's log start offset and high watermark from Kafka (read after the markers,
   so a marker is compared with a high watermark at least as new as the one its purge saw);
3. every live simulated region's unflushed acknowledged rows (read after the log start).

"Needed" means: an acknowledged row of a region that is not yet durable in the region's
own SST (memtable or a flush in progress), i.e. an entry above that region's
`flushed_entry_id` that the region would replay after a crash. Every such row must still
be readable: entry id >= the topic's log start offset. Because the log start was read
before the rows, a row found below it was already deleted while needed (no false alarm:
rows acknowledged later get offsets above the high watermark, and a row flushed in
between is no longer listed). Entries of a topic that belong to other regions, or that
an idle region has no rows in, are not needed by that region.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from metasrv import keys
from metasrv.errors import MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.model import PartitionOffsets
from tests.faults._summary import FaultSummary
from toolbox.simulator import SimDatanode

logger = logging.getLogger(__name__)


class InvariantMonitor:
    """Samples the invariants in a background thread; `violations` lists what broke."""

    def __init__(
        self,
        cluster: str,
        *,
        etcd: list[str],
        kafka: str,
        datanodes: Callable[[], Iterable[SimDatanode]],
        topics: Callable[[], list[str]],
        summary: FaultSummary,
        interval: float = 0.5,
        extra_check: Callable[[dict[str, PartitionOffsets]], list[str]] | None = None,
    ) -> None:
        """`extra_check`: more invariants, given each sample's offsets (read before it is
        called) and returning what it found broken, e.g. the WAL archive's
        (tests/faults/_archive.py)."""
        self.cluster = cluster
        self._kv = EtcdKv(etcd, f"{cluster}/", timeout=2.0)
        self._admin = KafkaAdmin(kafka, request_timeout=3.0)
        self._datanodes = datanodes
        self._topics = topics
        self._summary = summary
        self._interval = interval
        self._extra_check = extra_check
        self.markers: dict[str, int] = {}
        self.violations: list[str] = []
        self.samples = 0
        self.skipped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Sample every `interval` seconds until `stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="invariants", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and release the clients."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._kv.close()
        self._admin.close()

    def take_violations(self) -> list[str]:
        """Violations found since the last call."""
        with self._lock:
            found, self.violations = self.violations, []
            return found

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sample()
            except MetasrvError as exc:
                # etcd or Kafka is down: that is the fault under test, not a finding.
                self.skipped += 1
                logger.debug("invariant sample skipped: %s", exc)

    def sample(self) -> list[str]:
        """One sample (see the module docstring); returns the violations it found."""
        with self._lock:
            found: list[str] = []
            markers = self._read_markers()
            topics = self._topics()
            offsets = self._admin.offsets(topics) if topics else {}
            found += self._check_markers(markers, offsets)
            found += self._check_needed(offsets)
            if self._extra_check is not None:
                found += self._extra_check(offsets)
            self.samples += 1
            self.violations += found
            for problem in found:
                logger.error("invariant violated: %s", problem)
            return found

    def _read_markers(self) -> dict[str, int]:
        out = {}
        for kv in self._kv.range(keys.TOPIC_NAME_PREFIX):
            try:
                marker = keys.decode_marker(kv.value).pruned_entry_id
            except ValueError:  # damaged: the purge refuses it; nothing to compare here
                continue
            if marker is not None:
                out[kv.key[len(keys.TOPIC_NAME_PREFIX) :]] = marker
        return out

    def _check_markers(
        self, markers: dict[str, int], offsets: dict[str, PartitionOffsets]
    ) -> list[str]:
        found = []
        for topic, marker in markers.items():
            before = self.markers.get(topic)
            if before is not None and marker < before:
                found.append(f"{topic}: pruned_entry_id moved backwards {before} -> {marker}")
            self.markers[topic] = max(marker, before if before is not None else marker)
            off = offsets.get(topic)
            if off is not None and marker > off.high_watermark:
                found.append(
                    f"{topic}: pruned_entry_id {marker} above high watermark {off.high_watermark}"
                )
        return found

    def _check_needed(self, offsets: dict[str, PartitionOffsets]) -> list[str]:
        found = []
        for datanode in list(self._datanodes()):
            for region in list(datanode.regions.values()):
                off = offsets.get(region.topic)
                if off is None:
                    continue
                below = sorted(e for e in region.unflushed_entry_ids() if e < off.log_start_offset)
                if below:
                    self._summary.lost_rows(self.cluster, region.region_id, below, len(below))
                    found.append(
                        f"region {region.region_id} on {region.topic}: unflushed entries "
                        f"{below[:10]} below log start {off.log_start_offset} (deleted while "
                        f"needed); region now reports {region.stat()}; flushed "
                        f"{region.flushed_entry_id}; last heartbeat entries: "
                        f"{_reports(datanode, region.region_id)}"
                    )
        return found


def _reports(datanode: SimDatanode, region_id: int) -> list[tuple[float, str, object]]:
    reports = getattr(datanode.client, "reports", None)
    return reports(region_id)[-12:] if reports is not None else []
