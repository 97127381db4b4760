"""A process's CPU time and memory, read from Linux's /proc: how the benchmarks measure a
daemon (or a thread of it) from outside."""

from __future__ import annotations

import os
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second, the unit of /proc/<pid>/stat's CPU times."""


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` (all its threads), or of its thread `tid`."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def rss_mib(pid: int) -> float:
    """Resident memory of `pid` in MiB (NaN when /proc no longer says: a reaped process)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")
