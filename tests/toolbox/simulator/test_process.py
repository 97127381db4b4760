"""A simulated datanode as a real OS process: SIGKILL it, recover in a new process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from metasrv.kafka import KafkaAdmin
from metasrv.wire import MetasrvClient
from tests.toolbox.simulator._metasrv import DATANODE, OPERATOR
from toolbox.simulator import MetasrvProcess

pytestmark = pytest.mark.faults

FAST, SLOW = (7 << 32) | 1, (7 << 32) | 2


def simulator(*args: str) -> list[str]:
    return [sys.executable, "-m", "toolbox.simulator", *args]


def events(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def run_until_acknowledged(argv: list[str], at_least: int, heartbeats: int = 0) -> int:
    """Start a datanode process, SIGKILL it once it acknowledged `at_least` rows (and sent
    `heartbeats` heartbeats)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    acknowledged = sent = 0
    deadline = time.monotonic() + 60
    try:
        while acknowledged < at_least or sent < heartbeats:
            assert time.monotonic() < deadline, "datanode process wrote too slowly"
            line = proc.stdout.readline()
            assert line, f"datanode process exited early with {proc.wait()}"
            event = json.loads(line)
            if event["event"] == "stats":
                acknowledged = int(event["acknowledged"])
                sent = int(event["heartbeats"])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return acknowledged


def test_sigkilled_datanode_process_recovers_in_a_new_process(
    kafka_bootstrap: str, kafka_topic: str, tmp_path: Path
) -> None:
    common = ["--node-id", "3", "--kafka", kafka_bootstrap, "--data-dir", str(tmp_path)]
    common += ["--replay-from-flushed", "--flush-threshold", "4000"]
    regions = ["--region", f"{FAST}:{kafka_topic}", "--region", f"{SLOW}:{kafka_topic}:slow"]
    seen = run_until_acknowledged(
        simulator("run", *common, *regions, "--write-rate", "300"), at_least=300
    )

    done = subprocess.run(
        simulator("recover", *common), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    (report,) = [e for e in events(done.stdout) if e["event"] == "recovered"]
    assert report["missing"] == 0
    assert report["acknowledged"] >= seen
    by_region = {v["region_id"]: v for v in report["verifications"]}
    assert by_region[FAST]["recovered_from_sst"] > 0  # auto-flushed before the kill
    assert by_region[SLOW]["recovered_from_sst"] == 0  # never flushed: all from the WAL
    assert by_region[SLOW]["replayed"] >= by_region[SLOW]["acknowledged"] > 0


def test_recover_process_exits_2_when_kafka_lost_needed_entries(
    kafka_bootstrap: str, kafka_topic: str, kafka_admin: KafkaAdmin, tmp_path: Path
) -> None:
    common = ["--node-id", "4", "--kafka", kafka_bootstrap, "--data-dir", str(tmp_path)]
    common += ["--replay-from-flushed"]
    run_until_acknowledged(
        simulator("run", *common, "--region", f"{SLOW}:{kafka_topic}:slow", "--write-rate", "200"),
        at_least=50,
    )
    kafka_admin.delete_records({kafka_topic: 10})

    done = subprocess.run(
        simulator("recover", *common), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    (error,) = [e for e in events(done.stdout) if e["event"] == "error"]
    assert error["code"] == "wal_data_loss"
    assert error["details"]["start_entry_id"] == 0


def test_sigkilled_datanode_process_recovers_from_the_metasrv_replay_start(
    metasrv: MetasrvProcess, kafka_bootstrap: str, tmp_path: Path
) -> None:
    with MetasrvClient(metasrv.url, token=OPERATOR) as operator:
        topic = operator.add_region(FAST, 5).topic
        operator.add_region(SLOW, 5, topic)
        common = ["--node-id", "5", "--kafka", kafka_bootstrap, "--data-dir", str(tmp_path / "dn")]
        common += ["--metasrv", metasrv.url, "--token", DATANODE, "--flush-threshold", "4000"]
        common += ["--heartbeat-interval", "0.3"]
        regions = ["--region", f"{FAST}:{topic}", "--region", f"{SLOW}:{topic}:slow"]
        run_until_acknowledged(
            simulator(
                "run", *common, *regions, "--write-rate", "200", "--heartbeat-interval", "0.3"
            ),
            at_least=150,
            heartbeats=3,
        )
        (plan,) = operator.plan(topic)
        assert plan.blocked_by == []  # both regions reported from the killed process
        starts = {r: operator.replay_start(r) for r in (FAST, SLOW)}

    done = subprocess.run(
        simulator("recover", *common), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    (report,) = [e for e in events(done.stdout) if e["event"] == "recovered"]
    # The replay rule: metasrv's answer, or the manifest's flushed id + 1 where that is
    # higher (the killed process may have flushed after its last report).
    assert {r["region_id"]: r["start_entry_id"] for r in report["recoveries"]} == {
        r["region_id"]: max(starts[r["region_id"]], r["flushed_entry_id"] + 1)
        for r in report["recoveries"]
    }
    assert starts[SLOW] == 0
    assert report["missing"] == 0
    assert report["acknowledged"] >= 150
