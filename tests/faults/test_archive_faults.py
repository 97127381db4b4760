"""Faults of the WAL archive under load (issue #36): archivers SIGKILLed before their commit,
a rebalance between two archivers, the object store away, a broker killed while archiving.

The module's cluster is the suite's (three daemons, three datanodes, RF 3 on the suite's
three brokers) with `[wal.archive] enabled` against the suite's own S3Proxy, so the archive's
consumer group is pinned and bounds every purge. `metasrv archive` processes archive the WAL
pool. After each fault heals: each topic's objects hold [0, the group's committed offset) with
no gap; nothing Kafka deleted is missing from the archive (invariant 10, also sampled by the
monitor all along); every acknowledged row is read back from the archive below Kafka's log
start plus Kafka above it; purges resume (a log start passes the committed offset the fault
froze); and a crash of every datanode recovers every acknowledged row.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from metasrv.archive import PausePoint, parse_object_key, topic_prefix
from metasrv.errors import MetasrvError
from tests._wait import wait_until
from tests.faults._archive import ArchiveCheck, Archivers, SuiteObjectStore
from tests.faults._budget import FaultBudget
from tests.faults._cluster import FaultCluster
from tests.faults._services import FaultServices
from tests.faults._summary import FaultSummary
from tests.faults.conftest import run_dir

pytestmark = pytest.mark.faults

PROGRESS_TIMEOUT = 180.0
"""Bounds the wait for purges after a fault heals (a killed archiver's topics move after the
group's 10 s session timeout; a restarted store is retried after up to 10 s)."""


@pytest.fixture(scope="module")
def cluster_name() -> str:
    return f"a{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def archive_section(fault_s3: SuiteObjectStore, cluster_name: str) -> dict[str, object]:
    """The cluster's `[wal.archive]`: its own prefix in the bucket and its own group."""
    return fault_s3.archive_section(f"{cluster_name}/", f"{cluster_name}-archive")


@pytest.fixture(scope="module")
def archive_check(
    archive_section: dict[str, object], fault_services: FaultServices, cluster_name: str
) -> Iterator[ArchiveCheck]:
    check = ArchiveCheck(cluster_name, archive_section, fault_services.kafka)
    yield check
    check.close()


@pytest.fixture(scope="module")
def module_cluster(
    fault_services: FaultServices,
    fault_history_url: str,
    summary: FaultSummary,
    cluster_name: str,
    archive_section: dict[str, object],
    archive_check: ArchiveCheck,
) -> Iterator[FaultCluster]:
    """The suite's cluster with the archive enabled; its monitor samples invariant 10 too."""
    cluster = FaultCluster(
        name=cluster_name,
        kafka=fault_services.kafka,
        etcd=fault_services.etcd_endpoints,
        history_url=fault_history_url,
        workdir=run_dir(fault_services.cfg.state_dir, cluster_name),
        summary=summary,
        archive=dict(archive_section),
        extra_check=archive_check.sample,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        fault_services.up()
        cluster.close()  # its monitor first: the objects go next
        store = archive_check.store
        with contextlib.suppress(MetasrvError):
            for obj in store.list(str(archive_section["prefix"])):
                store.delete(obj.key)


@pytest.fixture(scope="module")
def module_archivers(
    module_cluster: FaultCluster, archive_section: dict[str, object], archive_check: ArchiveCheck
) -> Iterator[Archivers]:
    spec = module_cluster.spec
    wal = {
        "broker_endpoints": module_cluster.kafka.split(","),
        "topic_name_prefix": f"{module_cluster.name}_wal",
        "num_topics": spec.num_topics,
    }
    archivers = Archivers(wal, dict(archive_section), module_cluster.workdir)
    yield archivers
    archivers.kill_all()


@pytest.fixture
def archivers(
    cluster: FaultCluster, module_archivers: Archivers, fault_s3: SuiteObjectStore
) -> Archivers:
    """The module's archivers, healed: the store up and one archiver holding every topic."""
    fault_s3.up()
    running = module_archivers.running()
    if not running:
        running = [module_archivers.start("a")]
    topics = set(cluster.workload.topics)
    wait_until(
        lambda: set().union(*(p.assigned() or set() for p in running)) == topics,
        "the archivers to hold every WAL topic",
        timeout=60.0,
    )
    return module_archivers


def _purged_past(cluster: FaultCluster, check: ArchiveCheck, held: dict[str, int | None]) -> None:
    """Some topic's log start passes the committed offset `held` (read when the fault began):
    the archive committed past it and a purge deleted past it."""
    topics = cluster.workload.topics

    def passed() -> bool:
        cluster.workload.check()
        starts = check.log_starts(topics)
        return any(starts[t] > (held.get(t) or 0) for t in topics)

    try:
        wait_until(
            passed,
            "a purge past the held offsets",
            timeout=PROGRESS_TIMEOUT,
            interval=0.5,
            ignore=(MetasrvError,),
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; held {held}, log starts {check.log_starts(topics)}") from None


def _healed(
    cluster: FaultCluster, check: ArchiveCheck, summary: FaultSummary, held: dict[str, int | None]
) -> None:
    """What must hold once a fault healed (module docstring)."""
    _purged_past(cluster, check, held)
    # First, so that rows a broken archive lost are counted in the summary line.
    verified = check.recoverable(list(cluster.workload.datanodes.values()), summary)
    print(f"  {verified} rows read back (listings repeated: {check.relisted})")
    check.covered(cluster.workload.topics)
    cluster.monitor.sample()  # invariant 10 among the others
    violations = cluster.monitor.take_violations()
    assert not violations, "\n".join(violations)


def test_archiver_killed_between_put_and_commit(
    cluster: FaultCluster, archivers: Archivers, archive_check: ArchiveCheck, summary: FaultSummary
) -> None:
    """SIGKILL of an archiver paused after its put, then of one paused after its
    verification: neither range is committed, and the next archiver archives it again."""
    topics = cluster.workload.topics
    prefix = archive_check.settings.prefix
    for point in PausePoint:
        archivers.stop_all()
        held = archive_check.committed(topics)
        paused = archivers.start("paused", pause_at=point.value)
        [record] = wait_until(
            functools.partial(paused.logged, "paused (test hook)"),
            f"a pause {point.value}",
            timeout=60.0,
        )
        topic = record["topic"]
        stored = parse_object_key(prefix, record["key"])
        assert (held[topic] or 0) == stored.first_entry_id
        listed = [o.key for o in archive_check.store.list(topic_prefix(prefix, topic))]
        assert record["key"] in listed
        paused.kill()
        summary.fault()
        assert archive_check.committed(topics) == held, "a range committed before its verification"
        archivers.start("a")
        _healed(cluster, archive_check, summary, held)
        print(f"archiver SIGKILLed {point.value} on {stored.key(prefix)}: archived again, purged")
    cluster.assert_recovers()


def test_second_archiver_joins_then_one_is_killed(
    cluster: FaultCluster, archivers: Archivers, archive_check: ArchiveCheck, summary: FaultSummary
) -> None:
    """Two archivers split the pool through the group; SIGKILL of one moves its topics to
    the other after the session timeout, and nothing is left unarchived."""
    topics = set(cluster.workload.topics)
    [first] = archivers.running()
    second = archivers.start("b")

    def split() -> bool:
        mine, theirs = first.assigned(), second.assigned()
        return bool(mine and theirs and not mine & theirs and mine | theirs == topics)

    wait_until(split, "the two archivers to split the pool", timeout=60.0)
    held = archive_check.committed(sorted(topics))
    first.kill()
    summary.fault()
    wait_until(
        lambda: second.assigned() == topics, "the survivor to hold every topic", timeout=60.0
    )
    _healed(cluster, archive_check, summary, held)
    cluster.assert_recovers()


def _not_ready(archivers: Archivers) -> bool:
    return all(not (p.readyz() or {}).get("ready", True) for p in archivers.running())


def test_object_store_paused_then_stopped(
    cluster: FaultCluster,
    archivers: Archivers,
    archive_check: ArchiveCheck,
    fault_s3: SuiteObjectStore,
    budget: FaultBudget,
    summary: FaultSummary,
) -> None:
    """The store SIGSTOPped (requests hang), then stopped (refused): the purge never passes
    the committed offset, no range is committed while the store is away, and archiving and
    purging resume once it is back."""
    topics = cluster.workload.topics
    held = archive_check.committed(topics)
    fault_s3.pause()
    summary.fault()
    try:
        cluster.run_for(budget.kafka_outage)
        committed = archive_check.committed(topics)
        starts = archive_check.log_starts(topics)
        assert all(starts[t] <= (committed[t] or 0) for t in topics), (starts, committed)
    finally:
        fault_s3.resume()
    _healed(cluster, archive_check, summary, held)

    fault_s3.stop()
    summary.fault()
    try:
        # Once every archiver saw the store fail, none has a verified range left to commit.
        wait_until(lambda: _not_ready(archivers), "the archivers to see the store away")
        held = archive_check.committed(topics)
        cluster.run_for(budget.kafka_outage)
        assert archive_check.committed(topics) == held, "a range committed with the store away"
        starts = archive_check.log_starts(topics)
        assert all(starts[t] <= (held[t] or 0) for t in topics), (starts, held)
    finally:
        fault_s3.up()
    _healed(cluster, archive_check, summary, held)
    cluster.assert_recovers()


def _coordinator(kafka: str, group: str) -> int:
    """Node id of the broker coordinating `group`."""
    admin = AdminClient({"bootstrap.servers": kafka})
    description = admin.describe_consumer_groups([group])[group].result(10)
    return int(description.coordinator.id)


def test_broker_killed_while_archiving(
    cluster: FaultCluster,
    archivers: Archivers,
    archive_check: ArchiveCheck,
    fault_services: FaultServices,
    summary: FaultSummary,
) -> None:
    """RF 3, min ISR 2: SIGKILL of the broker coordinating the archive's group. The group
    moves to another coordinator, archiving and purging go on with the broker down, and
    nothing is left unarchived once it is back."""
    topics = cluster.workload.topics
    node = _coordinator(cluster.kafka, archive_check.group)
    victim = fault_services.cluster.broker_of(node)
    held = archive_check.committed(topics)
    fault_services.kill(victim)
    summary.fault()
    try:
        _purged_past(cluster, archive_check, held)
        archive_check.covered(topics)
        print(f"{victim} (the group's coordinator) killed: archived and purged past {held}")
    finally:
        fault_services.start(victim)
    _healed(cluster, archive_check, summary, archive_check.committed(topics))
    cluster.assert_recovers()
