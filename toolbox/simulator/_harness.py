"""Run real `metasrv start` and `metasrv archive` children (demo, benchmarks, tests), and
read their logs.

The one launcher: `MetasrvProcess` starts `metasrv start [-c FILE]` (the console script of
this installation, so `PYTHONPATH` in `env` picks the code it runs), waits until it is
ready (and, if expected, serves as leader), and stops it; `ArchiverProcess` does the same for
`metasrv archive -c FILE` (ready: its group assigned it topics and the bucket answers);
`free_port` gives their ports; `log_records` reads the JSON lines they log, stamped with the
daemon's clock.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx

from metasrv.errors import ServiceError


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def metasrv_argv(*args: str) -> list[str]:
    """The `metasrv` command of this installation (the console script beside the interpreter)."""
    script = Path(sys.executable).with_name("metasrv")
    if script.exists():
        return [str(script), *args]
    found = shutil.which("metasrv")
    if found:
        return [found, *args]
    return [sys.executable, "-c", "from cli import main; main()", *args]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def render_config(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """A DESIGN §6 TOML config from `{section: {key: value}}` (scalars and lists only)."""
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def migrate(config: Path, log_path: Path) -> None:
    """`metasrv db upgrade -c config` (history and SQL kv databases); raises on failure."""
    done = subprocess.run(
        metasrv_argv("db", "upgrade", "-c", str(config)),
        capture_output=True,
        text=True,
        check=False,
    )
    log_path.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise ServiceError(f"metasrv db upgrade failed:\n{done.stdout}{done.stderr}")


def log_records(
    path: Path, msg_prefix: str = "", since: float = 0.0
) -> list[tuple[float, dict[str, Any]]]:
    """(epoch seconds, record) of each JSON line of a daemon's log at `path` whose `msg`
    starts with `msg_prefix` and whose stamp is at or after `since` (epoch seconds; a
    line whose stamp cannot be read counts as stamped at 0)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{") or msg_prefix not in line:
                continue
            try:
                record: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and str(record.get("msg", "")).startswith(msg_prefix):
                at = _epoch(str(record.get("ts", "")))
                if at >= since:
                    found.append((at, record))
    return found


def _epoch(stamp: str) -> float:
    """`2026-01-01T00:00:00.123Z` (the daemon's log stamp) -> epoch seconds; 0 if unreadable."""
    try:
        parsed = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return 0.0
    return parsed.replace(tzinfo=datetime.UTC).timestamp()


class _Child:
    """A `metasrv <command> [-c FILE]` child whose output goes to a log file: what the daemon
    and the archiver share (spawn, alive, tail, stop).

    `args`: more arguments of the command (`--log-level warning`). `env`: variables set over
    this process's environment (`PYTHONPATH` to run another checkout's code). `new_session`:
    the child leads its own process group, out of reach of a terminal's Ctrl-C."""

    command = ""
    """The `metasrv` subcommand the child runs."""

    def __init__(
        self,
        config: Path | None,
        log_path: Path,
        url: str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        new_session: bool = True,
    ) -> None:
        self.config = config
        self.log_path = log_path
        self.url = url
        self.args = list(args)
        self.env = dict(env or {})
        self.cwd = cwd
        self.new_session = new_session
        self._log: TextIO | None = None
        self._spawned_at = 0.0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The child's pid (once spawned)."""
        if self.proc is None:
            raise ServiceError(f"metasrv {self.command} was never started")
        return self.proc.pid

    def spawn(self) -> None:
        """Start the child; do not wait for it. Its output is appended to the log."""
        self._log = self.log_path.open("a")
        self._spawned_at = time.time()
        config = ["-c", str(self.config)] if self.config is not None else []
        self.proc = subprocess.Popen(
            metasrv_argv(self.command, *config, *self.args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env} if self.env else None,
            cwd=self.cwd,
            start_new_session=self.new_session,
        )

    def log_records(
        self, msg_prefix: str = "", since: float = 0.0
    ) -> list[tuple[float, dict[str, Any]]]:
        """`log_records` of this child's log."""
        return log_records(self.log_path, msg_prefix, since)

    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc is not None and self.proc.poll() is None

    def _exited(self) -> ServiceError | None:
        """The error to raise when the child is not running (None while it is)."""
        if self.alive():
            return None
        code = None if self.proc is None else self.proc.returncode
        return ServiceError(f"metasrv {self.command} exited with {code}:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        """The end of its log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> int | None:
        """SIGKILL (a crash) and reap; returns the exit code (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return self._closed()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (after SIGCONT: a paused process could not stop), then SIGKILL after
        `timeout`; returns the exit code (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self._closed()

    def _closed(self) -> int | None:
        """Close the log once the child has exited; its exit code."""
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if self.proc is None else self.proc.returncode


class MetasrvProcess(_Child):
    """A `metasrv start -c FILE` child (`config` None: `metasrv start` alone, configured by
    `env` and the files in `cwd`); its output goes to a log file."""

    command = "start"

    def start(self, ready_timeout: float = 60.0, *, expect_leader: bool = True) -> None:
        """Start the child; wait until `GET /readyz` answers 200 (and, if expected, says
        leader and the process serves)."""
        self.spawn()
        self.wait_ready(ready_timeout, expect_leader=expect_leader)

    def wait_ready(self, timeout: float = 60.0, *, expect_leader: bool = True) -> None:
        """Wait until `GET /readyz` answers 200 (and, if expected, says leader and the
        process serves); ServiceError with the log's end if it exits or times out."""
        deadline = time.monotonic() + timeout
        while True:
            if (exited := self._exited()) is not None:
                raise exited
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = httpx.get(f"{self.url}/readyz", timeout=2.0)
                if response.status_code == 200 and (
                    not expect_leader
                    or (response.json().get("is_leader") is True and self.serving())
                ):
                    return
            if time.monotonic() > deadline:
                raise ServiceError(f"metasrv not ready after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.3)

    def serving(self) -> bool:
        """This process serves as leader: elected (what `/readyz` reports) is not yet
        serving; until its map is current it answers 503. `GET /v1/leader` says so where
        it needs no token; the log line where it does."""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = httpx.get(f"{self.url}/v1/leader", timeout=2.0)
            if response.status_code == 200:
                return response.json().get("serving") is True
        return bool(self.log_records("serving as leader", since=self._spawned_at))

    def __enter__(self) -> MetasrvProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ArchiverProcess(_Child):
    """A `metasrv archive -c FILE` child (DESIGN §8's archiver); its output goes to a log file,
    `url` is its `[http] addr` (`/readyz`, `/metrics`)."""

    command = "archive"

    def start(self, ready_timeout: float = 60.0) -> list[str]:
        """Start the child; wait until `/readyz` says the group assigned it topics and the
        bucket answers; its topics."""
        self.spawn()
        return self.wait_assigned(ready_timeout)

    def wait_assigned(self, timeout: float = 60.0) -> list[str]:
        """Wait until it is ready and holds topics; its topics (sorted). ServiceError with the
        log's end if it exits or times out."""
        deadline = time.monotonic() + timeout
        while True:
            topics = self.assigned()
            if topics:
                return sorted(topics)
            if time.monotonic() > deadline:
                raise ServiceError(f"archiver not ready after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.3)

    def readyz(self) -> dict[str, Any] | None:
        """`/readyz`'s body (200 ready, 503 not), None while it does not answer;
        ServiceError with the log's end once the child has exited."""
        if (exited := self._exited()) is not None:
            raise exited
        with contextlib.suppress(httpx.HTTPError, ValueError):
            body = httpx.get(f"{self.url}/readyz", timeout=2.0).json()
            if isinstance(body, dict):
                return body
        return None

    def assigned(self) -> set[str] | None:
        """Its topics once it is ready, else None; ServiceError once it has exited."""
        state = self.readyz()
        return set(state["assigned"]) if state and state.get("ready") else None

    def __enter__(self) -> ArchiverProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
