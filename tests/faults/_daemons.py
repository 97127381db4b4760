"""`metasrv start -c FILE` processes the fault suite kills, pauses and restarts."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import httpx

from toolbox.simulator import MetasrvProcess, log_records


class Daemon:
    """One metasrv of the cluster: a fixed name, port and config; restarted as new
    incarnations (each with its own log file)."""

    def __init__(self, name: str, port: int, config: Path, workdir: Path) -> None:
        self.name = name
        self.port = port
        self.config = config
        self.workdir = workdir
        self.incarnation = 0
        self.paused = False
        self.process: MetasrvProcess | None = None

    @property
    def addr(self) -> str:
        """`host:port`, as the election advertises it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://{self.addr}"

    @property
    def log_path(self) -> Path:
        """Log of the current incarnation."""
        return self.workdir / f"{self.name}-{self.incarnation}.log"

    def start(self, *, expect_leader: bool = False, timeout: float = 90.0) -> None:
        """Start a new incarnation; wait until it is ready (and leads, if expected)."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        self.incarnation += 1
        self.paused = False
        self.process = MetasrvProcess(self.config, self.log_path, self.url)
        self.process.start(timeout, expect_leader=expect_leader)

    @property
    def alive(self) -> bool:
        """The process runs (possibly paused)."""
        return self.process is not None and self.process.alive()

    @property
    def pid(self) -> int:
        """Pid of the running incarnation."""
        if self.process is None or self.process.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process.proc.pid

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        assert self.process is not None and self.process.proc is not None
        os.kill(self.pid, signal.SIGKILL)
        self.process.proc.wait(30)
        self.paused = False
        self.process.stop()  # closes the log handle

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and believes whatever it believed."""
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        if self.paused and self.alive:
            os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """Graceful stop (SIGTERM, then SIGKILL); continues a paused process first."""
        self.resume()
        if self.process is not None:
            self.process.stop(timeout=20)

    def view(self, timeout: float = 1.5) -> dict[str, Any] | None:
        """`GET /v1/leader` of this process, None when it does not answer."""
        if not self.alive or self.paused:
            return None
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = httpx.get(f"{self.url}/v1/leader", timeout=timeout)
            if response.status_code == 200:
                body: dict[str, Any] = response.json()
                return body
        return None

    def log_records(self, since: float = 0.0) -> list[dict[str, Any]]:
        """JSON log lines of the current incarnation stamped at or after `since` (epoch s)."""
        return [record for _, record in log_records(self.log_path, since=since)]
