"""Reading a `metasrv start` daemon's JSON log: the benchmarks time events by its lines
(an election, a lost lease, the map loaded, a term's first purge round)."""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import time
from pathlib import Path
from typing import Any


def log_records(path: Path, msg_prefix: str) -> list[tuple[float, dict[str, Any]]]:
    """(wall time, record) of each JSON log line whose msg starts with `msg_prefix`."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            if msg_prefix not in line:
                continue
            with contextlib.suppress(ValueError, KeyError):
                record = json.loads(line)
                if record["msg"].startswith(msg_prefix):
                    ts = datetime.datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
                    found.append((ts.replace(tzinfo=datetime.UTC).timestamp(), record))
    return found


def first_after(path: Path, msg_prefix: str, since: float) -> tuple[float, dict[str, Any]] | None:
    """Seconds from `since` (wall time) to the first such line at or after it, and the line."""
    later = [(ts - since, rec) for ts, rec in log_records(path, msg_prefix) if ts >= since - 0.001]
    return later[0] if later else None


def leadership(workdir: Path, killed: float) -> list[str]:
    """Elections and losses in both logs, "<s from the SIGKILL> <process> <event>": a run
    whose leader lost its lease before the kill (a slow etcd) measured something else."""
    found = [
        (ts - killed, name, msg, str(rec.get("reason") or "")[:60])
        for name in ("a", "b")
        for msg in ("elected leader", "leadership lost")
        for ts, rec in log_records(workdir / f"{name}.log", msg)
    ]
    return [f"{t:+.2f} {p} {m}" + (f" ({r})" if r else "") for t, p, m, r in sorted(found)]


def wait_log(path: Path, msg_prefix: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until `msg_prefix` is in the log at `path` (SystemExit if the process exits)."""
    t0 = time.monotonic()
    while not log_records(path, msg_prefix):
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            raise SystemExit(f"no {msg_prefix!r} in {path}")
        time.sleep(0.5)
    return round(time.monotonic() - t0, 1)
