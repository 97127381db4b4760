"""A real `metasrv start` child for the simulator tests (SQL kv on SQLite, ticker off)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.toolbox.simulator._metasrv import settings, start_metasrv
from toolbox.simulator import MetasrvProcess, free_port


@pytest.fixture
def metasrv(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Iterator[MetasrvProcess]:
    """A leader on the SQL kv backend (SQLite) with the ticker off."""
    port = free_port()
    kv = {"backend": "sql", "sql_url": f"sqlite:///{tmp_path / 'kv.db'}"}
    proc = start_metasrv(
        tmp_path,
        "metasrv",
        settings(unique_prefix, kafka_bootstrap, port, kv, f"sqlite:///{tmp_path / 'h.db'}"),
    )
    proc.start()
    yield proc
    proc.stop()
