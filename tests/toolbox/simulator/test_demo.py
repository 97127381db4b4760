"""`metasrv demo` end to end (a shortened run) on the local stack."""

from __future__ import annotations

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
    # The metasrv child was stopped: its log ends with uvicorn's shutdown.
    assert "Finished server process" in (run_dir / "metasrv.log").read_text()
