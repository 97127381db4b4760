"""One kv store per test on each real backend: etcd, PostgreSQL and SQLite.

`kv_store(prefix)` opens a backend with that key prefix on the test's store; backends
opened with different prefixes share the store (for isolation tests). etcd tests live
under the test's unique prefix and delete it afterwards; SQL tests get a new database
(SQLite file, or a fresh PostgreSQL schema migrated with Alembic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

import migrations
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from tests.metasrv.kv._pgschema import fresh_schema

KvFactory = Callable[[str], KvBackend]

BACKENDS = ["etcd", "postgresql", "sqlite"]


@pytest.fixture(params=BACKENDS)
def kv_store(
    request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: str
) -> Iterator[KvFactory]:
    opened: list[KvBackend] = []
    with ExitStack() as stack:
        if request.param == "etcd":
            endpoint: str = request.getfixturevalue("etcd_endpoint")
            root = f"{unique_prefix}/"

            def factory(prefix: str) -> KvBackend:
                kv = EtcdKv([endpoint], root + prefix)
                opened.append(kv)
                return kv

            cleaner = EtcdKv([endpoint], root)
            stack.callback(cleaner.close)
            stack.callback(cleaner.delete_prefix, "")
        else:
            if request.param == "postgresql":
                url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
                migrations.upgrade(url)
            else:
                url = f"sqlite:///{tmp_path / 'kv.db'}"
                migrations.upgrade(url)

            def factory(prefix: str) -> KvBackend:
                kv = SqlKv(url, prefix)
                opened.append(kv)
                return kv

        try:
            yield factory
        finally:
            for kv in opened:
                kv.close()


@pytest.fixture
def kv(kv_store: KvFactory) -> KvBackend:
    """A backend with an empty key prefix on the test's store."""
    return kv_store("")
