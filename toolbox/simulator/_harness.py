"""Run a real `metasrv start -c FILE` child for simulations (demo, benchmarks, tests)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
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


class MetasrvProcess:
    """A `metasrv start -c FILE` child; its output goes to a log file."""

    def __init__(self, config: Path, log_path: Path, url: str) -> None:
        self.config = config
        self.log_path = log_path
        self.url = url
        self._log: TextIO | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 60.0, *, expect_leader: bool = True) -> None:
        """Start the child; wait until `GET /readyz` answers 200 (and, if expected, says
        leader and the log says it serves)."""
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            metasrv_argv("start", "-c", str(self.config)),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + ready_timeout
        while True:
            if not self.alive():
                raise ServiceError(f"metasrv exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = httpx.get(f"{self.url}/readyz", timeout=2.0)
                if response.status_code == 200 and (
                    not expect_leader
                    or (response.json().get("is_leader") is True and self._serving_logged())
                ):
                    return
            if time.monotonic() > deadline:
                raise ServiceError(f"metasrv not ready after {ready_timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.3)

    def _serving_logged(self) -> bool:
        """The log says this process serves as leader: elected (what `/readyz` reports) is
        not yet serving; until its map is current it answers 503."""
        return "serving as leader" in self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        """The end of its log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if self.proc is None else self.proc.returncode

    def __enter__(self) -> MetasrvProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
