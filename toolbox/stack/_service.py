"""What every local service offers the stack orchestration."""

from __future__ import annotations

import abc
from pathlib import Path

from toolbox.stack._config import StackConfig
from toolbox.stack._process import pid_alive, port_open, terminate, tracked_pid, wait_until


class Service(abc.ABC):
    """One local service: install once, start detached, probe with a real request, stop."""

    name: str = ""
    stop_grace: float = 30.0

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.dir = cfg.state_dir / self.name
        self.pid_file = self.dir / f"{self.name}.pid"

    @property
    @abc.abstractmethod
    def port(self) -> int:
        """The client port (also the 'is something there already' check)."""

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """What a client connects to."""

    @property
    @abc.abstractmethod
    def log_file(self) -> Path:
        """Where the service's output goes."""

    @property
    def pid_marker(self) -> str:
        """A string that must appear in the process's command line (guards pid reuse)."""
        return str(self.dir)

    @abc.abstractmethod
    def install(self) -> None:
        """Fetch binaries / initialise data once; a no-op when already done."""

    @abc.abstractmethod
    def launch(self) -> None:
        """Start the process detached (installed, not running)."""

    @abc.abstractmethod
    def healthy(self, timeout: float = 5.0) -> bool:
        """True when the endpoint answers a real request."""

    def pid(self) -> int | None:
        """Pid of the process this state dir started, when alive."""
        return tracked_pid(self.pid_file, self.pid_marker)

    def process_alive(self) -> bool:
        """The process in the pid file exists (no command-line check).

        Used while starting: between fork and exec the child's command line is still
        ours, so `pid()` would wrongly report it gone.
        """
        try:
            return pid_alive(int(self.pid_file.read_text().strip()))
        except (OSError, ValueError):
            return False

    def listening(self) -> bool:
        """Something accepts TCP connections on the client port."""
        return port_open(self.cfg.host, self.port)

    def start(self) -> None:
        """Launch and wait until a real request is answered."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.launch()
        wait_until(
            self.name,
            lambda: self.listening() and self.healthy(),
            timeout=self.cfg.ready_timeout,
            log_file=self.log_file,
            alive=self.process_alive,
        )

    def stop(self) -> bool:
        """Stop the process this state dir started; False when none was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        terminate(pid, grace=self.stop_grace)
        self.pid_file.unlink(missing_ok=True)
        return True
