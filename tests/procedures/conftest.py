"""Fixtures for procedure tests: a leader stack on real Kafka + etcd, SQL history per test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import migrations
from metasrv.errors import MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from procedures import Procedure
from tests.procedures._harness import Harness, make_settings

HarnessFactory = Callable[..., Awaitable[Harness]]


@pytest.fixture
def history_url(tmp_path: Path) -> str:
    """A migrated SQLite history database for this test."""
    url = f"sqlite:///{tmp_path / 'history.db'}"
    migrations.upgrade(url)
    return url


@pytest.fixture
async def harness_factory(
    kafka_bootstrap: str, etcd_endpoint: str, unique_prefix: str, history_url: str
) -> AsyncIterator[HarnessFactory]:
    """`await factory(**settings_overrides)` -> a started leader (`kinds`: procedure kinds
    it runs besides the purge); all closed and cleaned after."""
    built: list[Harness] = []

    async def factory(
        *, start: bool = True, kinds: Sequence[type[Procedure[Any, Any]]] = (), **overrides: Any
    ) -> Harness:
        settings = make_settings(
            kafka=kafka_bootstrap, etcd=etcd_endpoint, prefix=unique_prefix, **overrides
        )
        h = Harness(settings, history_url, kinds=kinds)
        built.append(h)
        if start:
            await h.start()
        return h

    try:
        yield factory
    finally:
        for h in built:
            await h.close()
        cleaner = EtcdKv([etcd_endpoint], f"{unique_prefix}/")
        cleaner.delete_prefix("")
        cleaner.close()
        admin = KafkaAdmin(kafka_bootstrap)
        with contextlib.suppress(MetasrvError):
            admin.delete_topics(t for t in admin.list_topics() if t.startswith(unique_prefix))


@pytest.fixture
async def leader(harness_factory: HarnessFactory) -> Harness:
    """A started leader with default test settings."""
    return await harness_factory()
