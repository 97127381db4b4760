"""One demo run: what its phases share (the run directory, tokens, clients, the metasrv and
archiver children, the datanodes and the watcher), and the clean-up at its end."""

from __future__ import annotations

import logging
import secrets
import tempfile
from pathlib import Path

from rich.console import Console
from rich.live import Live

from metasrv.archive import ObjectStore
from metasrv.errors import MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.settings import ArchiveSettings
from metasrv.wire import MetasrvClient
from toolbox.demo._config import DemoOptions, DemoServices, archive_section
from toolbox.demo._report import Findings, Watcher
from toolbox.simulator import ArchiverProcess, MetasrvProcess, Workload, free_port
from toolbox.stack import Cluster

logger = logging.getLogger(__name__)


class DemoRun:
    """One demo run: what the phases share."""

    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.run_id = secrets.token_hex(3)
        self.run_dir = options.run_dir or Path(
            tempfile.mkdtemp(prefix=f"metasrv-demo-{self.run_id}-")
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tokens = {r: secrets.token_urlsafe(16) for r in ("datanode", "operator", "viewer")}
        self.findings = Findings()
        self.victim = 1 % options.nodes
        self.url = f"http://127.0.0.1:{free_port()}"
        self.operator = MetasrvClient(self.url, token=self.tokens["operator"], timeout=15.0)
        self.viewer = MetasrvClient(self.url, token=self.tokens["viewer"], timeout=15.0)
        self.config = self.run_dir / "metasrv.toml"
        self.metasrv = MetasrvProcess(self.config, self.run_dir / "metasrv.log", self.url)
        # Out of reach of the terminal's Ctrl-C (its own session): close() stops it.
        self.archiver = ArchiverProcess(
            self.run_dir / "archiver.toml",
            self.run_dir / "archiver.log",
            f"http://127.0.0.1:{free_port()}",
        )
        self._services: DemoServices | None = None
        self._store: ObjectStore | None = None
        self.cluster: Cluster | None = None
        self._workload: Workload | None = None
        self._watcher: Watcher | None = None

    @property
    def services(self) -> DemoServices:
        assert self._services is not None, "the services phase runs first"
        return self._services

    @property
    def archive(self) -> ArchiveSettings:
        """The demo's `[wal.archive]`, as metasrv, the archiver and the datanodes read it."""
        return ArchiveSettings.model_validate(archive_section(self.services.s3, self.run_id))

    @property
    def store(self) -> ObjectStore:
        """A client of the archive's bucket (built on first use)."""
        if self._store is None:
            self._store = ObjectStore(self.archive)
        return self._store

    @property
    def workload(self) -> Workload:
        assert self._workload is not None, "the datanodes phase runs first"
        return self._workload

    @property
    def watcher(self) -> Watcher:
        assert self._watcher is not None, "the datanodes phase runs first"
        return self._watcher

    def purge_and_wait(self) -> list[str]:
        """Submit a manual purge of every topic; count the final states; one line per topic."""
        lines = []
        for info in self.operator.wait(self.operator.purge(), timeout=120):
            states = self.findings.procedures
            states[info.state] = states.get(info.state, 0) + 1
            outcome = f" — {info.outcome}" if info.outcome else ""
            lines.append(f"{info.topic}: {info.state}{outcome}")
        return lines

    def write_live(self, title: str, seconds: float) -> None:
        """Let the datanodes write for `seconds`, showing the topic table as it changes."""
        watcher = self.watcher
        watcher.phase = title
        with Live(watcher.table(), console=self.console, refresh_per_second=2) as live:

            def tick(elapsed: float) -> None:
                watcher.tick(elapsed)
                watcher.phase = f"{title} ({elapsed:.0f}/{seconds:.0f}s)"
                live.update(watcher.table())
                if not self.metasrv.alive():
                    raise MetasrvError(f"metasrv exited:\n{self.metasrv.tail()}")

            self.workload.run(seconds, tick=tick)
        if not self.console.is_terminal:
            self.console.line()  # off a terminal the live table leaves no line break behind

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        if self._workload is not None:
            self._workload.close()
        self.operator.close()
        self.viewer.close()
        self.archiver.stop()
        self.metasrv.stop()
        if self.cluster is not None:
            self.cluster.heal()
        if self._services is not None:
            _delete_topics(self._services.kafka_bootstrap, f"demo_{self.run_id}_")
            self._delete_archive()

    def _delete_archive(self) -> None:
        """Remove the run's objects (the stack's bucket is shared, as its Kafka is)."""
        try:
            for obj in self.store.list(self.archive.prefix):
                self.store.delete(obj.key)
        except MetasrvError as exc:
            logger.warning("could not delete the demo's archive: %s", exc)
        finally:
            self.store.close()


def _delete_topics(bootstrap: str, prefix: str) -> None:
    """Remove the demo's topics (the stack is shared; don't leave data behind)."""
    admin = KafkaAdmin(bootstrap)
    try:
        admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
    except MetasrvError as exc:
        logger.warning("could not delete demo topics: %s", exc)
    finally:
        admin.close()
