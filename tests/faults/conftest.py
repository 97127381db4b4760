"""Fixtures of the fault suite: its own Kafka and etcd clusters (and, for the WAL archive's
faults, its own S3-compatible server), a PostgreSQL history schema, one multi-process cluster
per module, the budget (bounded or long) and the summary line.

Bounded by default (part of `make test`); `--run-slow` or `METASRV_FAULTS_LONG=1` runs
the long version (docs/faults.md).
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import migrations
from tests._wait import wait_until
from tests.faults._archive import SuiteObjectStore
from tests.faults._budget import FaultBudget
from tests.faults._cluster import FaultCluster
from tests.faults._services import FaultServices, fault_stack_config
from tests.faults._summary import FaultSummary
from tests.metasrv.kv._pgschema import fresh_schema

_HERE = Path(__file__).resolve().parent
SUMMARY = FaultSummary()
KEEP_RUNS = 12


def run_dir(state_dir: Path, name: str) -> Path:
    """`<state dir>/runs/<name>`: daemon logs and datanode data, kept for the last
    `KEEP_RUNS` clusters (outside pytest's basetemp, which concurrent sessions rotate)."""
    runs = state_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    old = sorted(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    for path in old[: max(0, len(old) - KEEP_RUNS + 1)]:
        shutil.rmtree(path, ignore_errors=True)
    path = runs / name
    path.mkdir()
    return path


def _in_suite(item: pytest.Item) -> bool:
    return _HERE in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    budget = FaultBudget.choose(run_slow=bool(config.getoption("--run-slow")))
    for item in items:
        if _in_suite(item):
            item.add_marker(pytest.mark.timeout(budget.test_timeout))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY.ran:
        terminalreporter.write_line(SUMMARY.line())


@pytest.fixture(scope="session")
def budget(pytestconfig: pytest.Config) -> FaultBudget:
    """Bounded or long run."""
    return FaultBudget.choose(run_slow=bool(pytestconfig.getoption("--run-slow")))


@pytest.fixture(scope="session")
def summary() -> FaultSummary:
    """The session's counters."""
    SUMMARY.ran = True
    return SUMMARY


@pytest.fixture(scope="session")
def fault_services(budget: FaultBudget) -> Iterator[FaultServices]:
    """The suite's own Kafka and etcd clusters, started for the session and stopped after it.

    One session at a time on this machine (the ports are fixed, whatever the checkout):
    another one would stop and freeze the same services under this one's feet, so a
    second session waits for the first.
    """
    cfg = fault_stack_config()
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    lock_path = Path(tempfile.gettempdir()) / f"metasrv-faults-{cfg.cluster_kafka_ports[0]}.lock"
    with lock_path.open("a") as lock:

        def locked() -> bool:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True

        wait_until(
            locked,
            f"the fault-suite lock {lock_path} (another session holds it)",
            timeout=max(30.0, budget.test_timeout - 60),
            interval=1.0,
            ignore=(BlockingIOError,),
        )
        services = FaultServices(cfg)
        try:
            services.up()
            yield services
        finally:
            services.down()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def fault_s3(fault_services: FaultServices) -> Iterator[SuiteObjectStore]:
    """The suite's own S3-compatible server (for the WAL archive), stopped after the session."""
    store = SuiteObjectStore(fault_services.cfg.state_dir)
    store.up()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="session")
def fault_history_url(postgres_url: str) -> Iterator[str]:
    """A migrated PostgreSQL schema for the daemons' SQL history (dropped at the end)."""
    with fresh_schema(postgres_url) as url:
        migrations.upgrade(url)
        yield url


@pytest.fixture(scope="module")
def module_cluster(
    fault_services: FaultServices,
    fault_history_url: str,
    summary: FaultSummary,
) -> Iterator[FaultCluster]:
    """Three daemons and three datanodes under load, shared by one module's tests."""
    name = f"f{uuid.uuid4().hex[:8]}"
    cluster = FaultCluster(
        name=name,
        kafka=fault_services.kafka,
        etcd=fault_services.etcd_endpoints,
        history_url=fault_history_url,
        workdir=run_dir(fault_services.cfg.state_dir, name),
        summary=summary,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        fault_services.up()
        cluster.close()


@pytest.fixture
def cluster(module_cluster: FaultCluster, fault_services: FaultServices) -> FaultCluster:
    """The module's cluster, healed (services up, every daemon running, a serving leader)."""
    fault_services.up()
    module_cluster.heal()
    module_cluster.workload.check()
    return module_cluster
