"""Run the installed `metasrv` command with its stdout on a pseudo-terminal of a given width."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from dataclasses import dataclass

from toolbox.simulator import metasrv_argv

# CSI sequences (colours, cursor) and OSC sequences (hyperlinks) rich may write to a terminal.
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


@dataclass(frozen=True)
class TerminalRun:
    """What a command wrote to the terminal (escapes removed, `\\n` line ends) and its exit."""

    exit_code: int
    text: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def run_in_terminal(
    *args: str, columns: int = 80, env: dict[str, str] | None = None, timeout: float = 60.0
) -> TerminalRun:
    """`metasrv *args` with stdin/stdout on a pty `columns` wide (COLUMNS set to match)."""
    controller, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    full_env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), **(env or {})}
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        full_env.pop(name, None)
    proc = subprocess.Popen(
        metasrv_argv(*args),
        stdin=child,
        stdout=child,
        stderr=subprocess.PIPE,
        env=full_env,
        close_fds=True,
    )
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    raw = b"".join(chunks).decode()
    text = _ESCAPES.sub("", raw).replace("\r\n", "\n")
    return TerminalRun(proc.returncode, text, err.decode())
