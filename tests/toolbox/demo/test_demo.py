"""`metasrv demo` end to end (a shortened run) on the local stack, its archive phase included."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from toolbox.demo import PHASES
from toolbox.simulator import metasrv_argv

pytestmark = pytest.mark.slow


def test_demo_passes_and_cleans_up_its_children(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    argv = metasrv_argv("demo", "--phase-seconds", "8", "--nodes", "2", "--regions-per-node", "4")
    done = subprocess.run(
        [*argv, "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=280, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    # "demo passed" is printed only when no acknowledged row is missing and no needed entry
    # was deleted (Findings.ok).
    assert "demo passed" in out and "demo FAILED" not in out
    for number in range(1, len(PHASES) + 1):
        assert f"{number}/{len(PHASES)} " in out, f"phase {number} did not run"
    assert "Crash recovery" in out and "WAL purge summary" in out
    assert "/dashboard" in out
    # The archive phase: a trim out of band, and rows that came back only from the archive.
    assert "DeleteRecords(" in out and "out of band" in out
    # (rich wraps long lines at a space)
    restored = re.search(r"(\d+)\s+acknowledged\s+rows\s+that\s+only\s+the\s+archive", out)
    assert restored is not None and int(restored.group(1)) > 0, out[-4000:]
    # The metasrv child was stopped: its log ends with uvicorn's shutdown; the archiver
    # left its group on SIGTERM.
    assert "Finished server process" in (run_dir / "metasrv.log").read_text()
    assert "archiver stopped" in (run_dir / "archiver.log").read_text()
