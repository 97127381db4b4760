"""`metasrv demo` end to end (a shortened run) on the local stack."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
    assert "demo passed" in out
    assert "missing" in out and "WAL purge summary" in out
    assert "/dashboard" in out
    # The metasrv child was stopped: its log ends with uvicorn's shutdown.
    assert "Finished server process" in (run_dir / "metasrv.log").read_text()
