"""`metasrv stack`: status, idempotent up, reuse of foreign services, start/stop by pid."""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from metasrv.errors import ServiceError
from toolbox.simulator import free_port
from toolbox.stack import (
    StackConfig,
    ensure_up,
    pid_alive,
    port_open,
    service_pid,
    spark_master_status,
    start_service,
    status,
    stop_service,
)


def test_status_reports_every_service_healthy(stack_config: StackConfig) -> None:
    result = CliRunner().invoke(
        app, ["stack", "status", "--state-dir", str(stack_config.state_dir)]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name in ("kafka", "etcd", "postgres"):
        row = next(line for line in lines if line.startswith(name))
        assert row.rstrip().endswith("healthy") and "UNHEALTHY" not in row
    assert f"KAFKA_BOOTSTRAP=127.0.0.1:{stack_config.kafka_port}" in lines
    assert f"ETCD_ENDPOINT=127.0.0.1:{stack_config.etcd_port}" in lines
    assert (
        f"POSTGRES_URL=postgresql+psycopg://metasrv:metasrv@127.0.0.1:{stack_config.postgres_port}"
        "/metasrv" in lines
    )


def test_status_exits_nonzero_when_a_service_is_unreachable(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["stack", "status", "--state-dir", str(tmp_path), "--etcd-port", str(free_port())]
    )
    assert result.exit_code == 1
    etcd_row = next(line for line in result.output.splitlines() if line.startswith("etcd"))
    assert "not running" in etcd_row and "UNHEALTHY" in etcd_row


def test_second_ensure_up_reuses_processes_and_does_not_download_again(
    stack_config: StackConfig,
) -> None:
    libs = stack_config.state_dir / "kafka" / "libs"
    marker = libs / f".installed-{stack_config.kafka_version}"
    install_log = stack_config.state_dir / "kafka" / "install.log"
    if not marker.exists():
        pytest.skip("kafka was not installed by this state dir (services reused from elsewhere)")
    before = (
        marker.stat().st_mtime_ns,
        install_log.stat().st_size,
        sorted(p.name for p in libs.iterdir()),
    )
    pids = {name: service_pid(stack_config, name) for name in ("kafka", "etcd", "postgres")}

    assert ensure_up(stack_config).kafka_bootstrap == f"127.0.0.1:{stack_config.kafka_port}"

    after = (
        marker.stat().st_mtime_ns,
        install_log.stat().st_size,
        sorted(p.name for p in libs.iterdir()),
    )
    assert after == before
    assert {name: service_pid(stack_config, name) for name in pids} == pids


def test_up_from_another_state_dir_reuses_healthy_services(
    stack_config: StackConfig, tmp_path: Path
) -> None:
    other = StackConfig.from_env(state_dir=tmp_path / "other")
    got = [start_service(other, name) for name in ("kafka", "etcd", "postgres")]
    assert all(st.healthy and st.external for st in got)
    # Nothing was installed or started under the other state dir.
    assert not (tmp_path / "other" / "kafka" / "libs").exists()
    assert all(st.pid is None for st in status(other))


def test_port_taken_by_something_else_is_a_service_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        cfg = StackConfig.from_env(state_dir=tmp_path, etcd_port=port, foreign_wait=1.0)
        with pytest.raises(ServiceError, match="etcd") as info:
            start_service(cfg, "etcd")
    assert info.value.details["service"] == "etcd"


@pytest.fixture
def spare_etcd(tmp_path: Path) -> Iterator[StackConfig]:
    cfg = StackConfig.from_env(
        state_dir=tmp_path / "stack", etcd_port=free_port(), etcd_peer_port=free_port()
    )
    yield cfg
    stop_service(cfg, "etcd")


def test_stop_and_start_one_service_by_pid(spare_etcd: StackConfig) -> None:
    cfg = spare_etcd
    first = start_service(cfg, "etcd")
    assert first.healthy and first.pid is not None and pid_alive(first.pid)
    assert start_service(cfg, "etcd").pid == first.pid  # idempotent

    assert stop_service(cfg, "etcd") is True
    assert not pid_alive(first.pid)
    assert not port_open("127.0.0.1", cfg.etcd_port)
    assert service_pid(cfg, "etcd") is None
    assert stop_service(cfg, "etcd") is False

    again = start_service(cfg, "etcd")
    assert again.healthy and again.pid not in (None, first.pid)


def test_failed_start_names_the_service_and_its_log(tmp_path: Path) -> None:
    # A peer port already taken makes etcd exit at start-up.
    cfg = StackConfig.from_env(
        state_dir=tmp_path, etcd_port=free_port(), etcd_peer_port=free_port()
    )
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", cfg.etcd_peer_port))
        squatter.listen()
        with pytest.raises(ServiceError) as info:
            start_service(cfg, "etcd")
    text = str(info.value)
    assert "etcd" in text and str(tmp_path / "etcd" / "etcd.log") in text
    assert "address already in use" in text
    assert service_pid(cfg, "etcd") is None


def test_up_prints_evalable_endpoint_lines_on_stdout(stack_config: StackConfig) -> None:
    result = CliRunner().invoke(app, ["stack", "up", "--state-dir", str(stack_config.state_dir)])
    assert result.exit_code == 0, result.output
    pairs = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert pairs == {
        "KAFKA_BOOTSTRAP": f"127.0.0.1:{stack_config.kafka_port}",
        "ETCD_ENDPOINT": f"127.0.0.1:{stack_config.etcd_port}",
        "POSTGRES_URL": (
            f"postgresql+psycopg://metasrv:metasrv@127.0.0.1:{stack_config.postgres_port}/metasrv"
        ),
    }


@pytest.fixture
def world_traversable_dir() -> Iterator[Path]:
    # Not under pytest's basetemp: pytest resets that to 0700 whenever any session starts,
    # and the postgres OS user must traverse every parent of its data dir.
    path = Path(tempfile.mkdtemp(prefix="metasrv-stack-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_kafka_and_postgres_stop_and_start_on_spare_ports(
    stack_config: StackConfig, world_traversable_dir: Path
) -> None:
    # Shares the downloaded jars (no second download) but runs its own broker and cluster.
    cfg = StackConfig.from_env(
        state_dir=world_traversable_dir / "stack",
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        postgres_port=free_port(),
    )
    libs = stack_config.state_dir / "kafka" / "libs"
    if not (libs / f".installed-{stack_config.kafka_version}").exists():
        pytest.skip("no local kafka jars to share")
    (cfg.state_dir / "kafka").mkdir(parents=True)
    (cfg.state_dir / "kafka" / "libs").symlink_to(libs)
    try:
        for name in ("kafka", "postgres"):
            first = start_service(cfg, name)
            assert first.healthy and first.pid is not None
            assert stop_service(cfg, name) is True
            assert not pid_alive(first.pid)
            assert not any(st.healthy for st in status(cfg) if st.name == name)
            again = start_service(cfg, name)
            assert again.healthy and again.pid not in (None, first.pid)
    finally:
        for name in ("kafka", "postgres"):
            stop_service(cfg, name)


def _free_port_block(size: int) -> int:
    """A base port with `size` consecutive ports free right now, below the ephemeral range
    (where outgoing connections would take them between this check and the bind)."""
    for base in range(random.randrange(20000, 30000, 10), 32000, 10):
        if not any(port_open("127.0.0.1", base + i) for i in range(size)):
            return base
    raise AssertionError("no free port block")


def test_up_spark_starts_a_master_and_two_workers_and_down_stops_them(
    stack_config: StackConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _free_port_block(6)
    monkeypatch.setenv("METASRV_STACK_SPARK_PORT", str(base))
    state = ["--state-dir", str(tmp_path / "stack")]
    up = CliRunner().invoke(app, ["stack", "up", "--spark", *state])
    try:
        assert up.exit_code == 0, up.output
        assert f"SPARK_MASTER=spark://127.0.0.1:{base}" in up.stdout.splitlines()
        cfg = StackConfig.from_env(state_dir=tmp_path / "stack")
        master = spark_master_status(cfg)
        assert master is not None and master["status"] == "ALIVE"
        workers = [w for w in master["workers"] if w["state"] == "ALIVE"]
        assert sorted(w["port"] for w in workers) == [base + 2, base + 4]
        assert all(w["cores"] == 1 for w in workers)
        pids = {
            name: service_pid(cfg, name)
            for name in ("spark-master", "spark-worker-0", "spark-worker-1")
        }
        assert all(pid is not None for pid in pids.values()), pids
        assert (tmp_path / "stack" / "spark-master" / "master.log").stat().st_size > 0
        # Kafka, etcd and PostgreSQL were the running stack's: reused, not started here.
        assert service_pid(cfg, "kafka") is None
    finally:
        down = CliRunner().invoke(app, ["stack", "down", *state])
    assert down.exit_code == 0, down.output
    assert "stopped: spark-worker-1, spark-worker-0, spark-master" in down.output
    assert not any(pid_alive(pid) for pid in pids.values() if pid is not None)
    assert not port_open("127.0.0.1", base)
