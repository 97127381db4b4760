"""Session fixtures for real services (Kafka, etcd, PostgreSQL, Spark, S3) and test markers.

`cluster_stack` is the production-shaped cluster (`toolbox.stack.cluster_up`), started only
for the tests that ask for it.

Every test that needs a service is marked `services` at collection: it uses a service fixture
(`SERVICE_FIXTURES`, directly or through other fixtures), or a fixture parametrised by a
backend that opens the service itself (`SERVICE_PARAMS`: "etcd", "postgresql"). `make check`
runs the rest (`-m "not services"`).

Each service fixture reuses the endpoint named by `METASRV_TEST_KAFKA` / `METASRV_TEST_ETCD` /
`METASRV_TEST_POSTGRES` when set; otherwise it brings the project's own local stack up
(`toolbox.stack.ensure_up`, idempotent, reusing healthy services already on the ports).
`s3_endpoint` likewise starts (or reuses) the stack's S3-compatible server alone, unless
`METASRV_TEST_S3` names an endpoint (with `METASRV_TEST_S3_BUCKET`, `..._ACCESS_KEY_ID`,
`..._SECRET_ACCESS_KEY`); each test keeps its objects under its own `s3_prefix`, where
`archive_store` is a WAL archive client, emptied after the test.
The stack is left running at the end of the session: CI or the developer takes it down.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from metasrv.kafka import KafkaAdmin
from toolbox.stack import (
    Cluster,
    Endpoints,
    S3Endpoint,
    StackConfig,
    cluster_up,
    ensure_up,
    s3_endpoint_of,
    start_service,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from metasrv.archive import ObjectStore


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow", action="store_true", default=False, help="also run @pytest.mark.slow tests"
    )


SERVICE_FIXTURES = frozenset(
    {
        "local_stack",
        "stack_config",
        "cluster_stack",
        "kafka_bootstrap",
        "etcd_endpoint",
        "postgres_url",
        "spark",
        "spark_master",
        "s3_endpoint",
    }
)
"""Fixtures that start or reach a real service."""
SERVICE_PARAMS = frozenset({"etcd", "postgresql"})
"""Backend parameters whose fixtures reach the service with `request.getfixturevalue`."""


def needs_services(item: pytest.Item) -> bool:
    """Whether a collected test reaches Kafka, etcd, PostgreSQL or Spark."""
    if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(isinstance(p, str) and p in SERVICE_PARAMS for p in params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if needs_services(item):
            item.add_marker(pytest.mark.services)
    if config.getoption("--run-slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow test: pass --run-slow to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(scope="session")
def local_stack() -> Endpoints:
    """The project's local stack, started if needed (never stopped by the tests)."""
    return ensure_up(StackConfig.from_env())


@pytest.fixture(scope="session")
def stack_config(local_stack: Endpoints) -> StackConfig:
    """Config of the running local stack, for fault tests that stop/start/signal its services
    (`toolbox.stack.stop_service`, `start_service`, `service_pid`)."""
    return StackConfig.from_env()


@pytest.fixture(scope="session")
def cluster_stack() -> Cluster:
    """The production-shaped cluster (a KRaft controller, 3 brokers at replication factor 3,
    `min.insync.replicas` 2, and a 3-member etcd), started on first use and left running.

    Tests that take a broker or member down call `heal()` when done (in a `finally`), so
    later tests find the cluster whole. Mark them `@pytest.mark.cluster`.
    """
    return cluster_up(StackConfig.from_env())


def _endpoint(request: pytest.FixtureRequest, env: str, field: str) -> str:
    given = os.environ.get(env)
    if given:
        return given
    stack: Endpoints = request.getfixturevalue("local_stack")
    value: str = getattr(stack, field)
    return value


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """Kafka bootstrap servers, "host:port"."""
    return _endpoint(request, "METASRV_TEST_KAFKA", "kafka_bootstrap")


@pytest.fixture(scope="session")
def etcd_endpoint(request: pytest.FixtureRequest) -> str:
    """etcd client endpoint, "host:port"."""
    return _endpoint(request, "METASRV_TEST_ETCD", "etcd_endpoint")


@pytest.fixture(scope="session")
def postgres_url(request: pytest.FixtureRequest) -> str:
    """SQLAlchemy URL of a PostgreSQL database the tests may create schemas in."""
    return _endpoint(request, "METASRV_TEST_POSTGRES", "postgres_url")


@pytest.fixture(scope="session")
def s3_endpoint() -> S3Endpoint:
    """A real S3-compatible server and a bucket the tests may write under their `s3_prefix`."""
    given = os.environ.get("METASRV_TEST_S3")
    if given:
        defaults = S3Endpoint(endpoint=given)
        return S3Endpoint(
            endpoint=given,
            bucket=os.environ.get("METASRV_TEST_S3_BUCKET", defaults.bucket),
            access_key_id=os.environ.get("METASRV_TEST_S3_ACCESS_KEY_ID", defaults.access_key_id),
            secret_access_key=os.environ.get(
                "METASRV_TEST_S3_SECRET_ACCESS_KEY", defaults.secret_access_key
            ),
        )
    cfg = StackConfig.from_env()
    start_service(cfg, "s3")
    return s3_endpoint_of(cfg)


@pytest.fixture
def s3_prefix(unique_prefix: str) -> str:
    """Unique per test: the key prefix (`t<8 hex>/`) its objects live under in the bucket."""
    return f"{unique_prefix}/"


@pytest.fixture
def archive_store(s3_endpoint: S3Endpoint, s3_prefix: str) -> Iterator[ObjectStore]:
    """A client of the WAL archive's bucket under the test's `s3_prefix`; what the test wrote
    there is deleted afterwards."""
    from tests._archive import open_store

    with open_store(s3_endpoint, s3_prefix) as store:
        yield store


@pytest.fixture
def unique_prefix() -> str:
    """Unique per test: `t` + 8 hex digits, valid as a Kafka topic prefix and a kv key prefix."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_admin(kafka_bootstrap: str) -> Iterator[KafkaAdmin]:
    """An admin client of the test broker."""
    client = KafkaAdmin(kafka_bootstrap)
    yield client
    client.close()


@pytest.fixture
def kafka_topic(kafka_admin: KafkaAdmin, unique_prefix: str) -> Iterator[str]:
    """A new single-partition topic `<unique_prefix>-wal`, deleted after the test."""
    name = f"{unique_prefix}-wal"
    assert kafka_admin.ensure_topics([name]) == [name]
    yield name
    kafka_admin.delete_topics([name])


def _java_home() -> str | None:
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    # /usr/bin/java -> /etc/alternatives/java -> /usr/lib/jvm/<jdk>/bin/java
    return str(Path(java).resolve().parents[1]) if java else None


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local[2] SparkSession with few shuffle partitions and no UI, stopped at session end."""
    java_home = _java_home()
    if java_home:
        os.environ["JAVA_HOME"] = java_home
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    builder: Any = SparkSession.builder
    session: SparkSession = (
        builder.master("local[2]")
        .appName("metasrv-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={warehouse}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
