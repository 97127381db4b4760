"""Detached child processes tracked by pid files, and readiness polling."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from metasrv.errors import ServiceError

logger = logging.getLogger(__name__)


def spawn(
    argv: Sequence[str],
    *,
    log_file: Path,
    pid_file: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> int:
    """Start `argv` in its own session (survives our exit), output to `log_file`; write its pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    pid_file.write_text(f"{proc.pid}\n")
    logger.info("started %s (pid %d), log %s", pid_file.stem, proc.pid, log_file)
    return proc.pid


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Field 3 (after the parenthesised command name) is the state; Z = zombie.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def tracked_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in `pid_file` if that process is alive and its command line mentions `marker`.

    The marker (a path inside the state dir) guards against a recycled pid.
    """
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    return pid if marker in cmdline else None


def terminate(pid: int, *, grace: float) -> None:
    """SIGTERM `pid`, wait up to `grace` seconds, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return
        time.sleep(0.2)
    logger.warning("pid %d ignored SIGTERM for %.0fs; sending SIGKILL", pid, grace)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pid_alive(pid):
        _reap(pid)
        time.sleep(0.1)


def _reap(pid: int) -> None:
    # Only our own children can be reaped; for others this is a no-op.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def dir_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on `directory/.lock` (one process at a time starts services)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def process_stopped(pid: int) -> bool:
    """True while `pid` is stopped by a signal (SIGSTOP): state T in /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 40) -> str:
    """Last `lines` lines of a log file ('' when missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    service: str,
    probe: Callable[[], bool],
    *,
    timeout: float,
    log_file: Path,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll `probe` until it returns True; raise `ServiceError` with the log tail otherwise.

    `alive` lets the wait stop early when the process has already exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        if probe():
            return
        if alive is not None and not alive():
            raise service_error(service, "exited during start-up", log_file)
        if time.monotonic() >= deadline:
            raise service_error(service, f"not ready after {timeout:.0f}s", log_file)
        time.sleep(0.5)


def service_error(service: str, what: str, log_file: Path) -> ServiceError:
    """A `ServiceError` naming the service and its log file, with the log's tail."""
    tail = log_tail(log_file)
    return ServiceError(
        f"{service} {what}; log: {log_file}\n--- last lines of {log_file} ---\n{tail}",
        details={"service": service, "log": str(log_file)},
    )


def run(
    argv: Sequence[str],
    *,
    what: str,
    log_file: Path,
    timeout: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run a set-up command to completion, appending its output to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            result = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                cwd=cwd,
                env=env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise service_error(what, f"set-up command failed ({exc})", log_file) from exc
    if result.returncode != 0:
        raise service_error(what, f"`{argv[0]}` exited {result.returncode}", log_file)
