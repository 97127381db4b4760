"""Fixtures of the archive tests: a WAL pool of real topics with its bucket prefix, the store
that reads it, and a private S3-compatible server a test may stop or signal."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from metasrv.archive import ObjectStore
from metasrv.kafka import KafkaAdmin
from tests.metasrv.archive._wal import Pool
from toolbox.simulator import free_port
from toolbox.stack import (
    S3PROXY_VERSION,
    S3Endpoint,
    StackConfig,
    service_pid,
    start_service,
    stop_service,
)


@pytest.fixture
def own_server(s3_endpoint: S3Endpoint, tmp_path: Path) -> Iterator[StackConfig]:
    """A private S3Proxy on a spare port (this test signals it), sharing the stack's jar."""
    jar = StackConfig.from_env().state_dir / "s3" / f"s3proxy-{S3PROXY_VERSION}.jar"
    if not jar.exists():
        pytest.skip("the running S3 server is not this stack's (no jar to share)")
    cfg = StackConfig.from_env(state_dir=tmp_path / "stack", s3_port=free_port())
    (cfg.state_dir / "s3").mkdir(parents=True)
    (cfg.state_dir / "s3" / jar.name).symlink_to(jar)
    start_service(cfg, "s3")
    try:
        yield cfg
    finally:
        pid = service_pid(cfg, "s3")
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        stop_service(cfg, "s3")


@pytest.fixture
def pool_size() -> int:
    """Topics in `pool` (a module overrides this fixture for more)."""
    return 2


@pytest.fixture
def pool(
    kafka_admin: KafkaAdmin,
    kafka_bootstrap: str,
    unique_prefix: str,
    s3_endpoint: S3Endpoint,
    s3_prefix: str,
    pool_size: int,
) -> Iterator[Pool]:
    """A WAL pool `{unique_prefix}_{n}` of `pool_size` topics, its group and bucket prefix."""
    topics = [f"{unique_prefix}_{n}" for n in range(pool_size)]
    assert kafka_admin.ensure_topics(topics) == topics
    group = f"{unique_prefix}-archive"
    yield Pool(kafka_bootstrap, unique_prefix, topics, group, s3_endpoint, s3_prefix)
    kafka_admin.delete_topics(topics)


@pytest.fixture
def store(pool: Pool) -> Iterator[ObjectStore]:
    """The pool's bucket prefix; emptied after the test."""
    client = ObjectStore(pool.wal_settings().archive)
    yield client
    for obj in client.list(pool.s3_prefix):
        client.delete(obj.key)
    client.close()
