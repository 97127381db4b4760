"""Fixtures for the reconcile tests: a kv backend per test on each real backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

import migrations
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from tests.metasrv.kv._pgschema import fresh_schema
from toolbox.stack import StackConfig, ensure_up


@pytest.fixture(scope="session")
def spark_master() -> str:
    """`spark://host:port` of a standalone cluster: `METASRV_TEST_SPARK_MASTER`, else the
    local stack's master and two workers (`metasrv stack up --spark`), started if needed."""
    given = os.environ.get("METASRV_TEST_SPARK_MASTER")
    if given:
        return given
    master = ensure_up(StackConfig.from_env(), spark=True).spark_master
    assert master is not None
    return master


@pytest.fixture(params=["etcd", "postgresql", "sqlite"])
def any_kv(
    request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: str
) -> Iterator[KvBackend]:
    """An empty kv backend: etcd under the test's prefix, or a fresh SQL database."""
    with ExitStack() as stack:
        kv: KvBackend
        if request.param == "etcd":
            kv = EtcdKv([request.getfixturevalue("etcd_endpoint")], f"{unique_prefix}/")
            stack.callback(kv.close)
            stack.callback(kv.delete_prefix, "")
        else:
            if request.param == "postgresql":
                url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
            else:
                url = f"sqlite:///{tmp_path / 'kv.db'}"
            migrations.upgrade(url)
            kv = SqlKv(url, f"{unique_prefix}/")
            stack.callback(kv.close)
        yield kv
