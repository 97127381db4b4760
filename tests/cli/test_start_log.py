"""`metasrv start`'s log: Alembic's set-up chatter is not logged at INFO."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metasrv.kafka import KafkaAdmin
from tests.toolbox.simulator._metasrv import settings, start_metasrv
from toolbox.simulator import MetasrvProcess, free_port


@pytest.fixture
def started(
    kafka_bootstrap: str, kafka_admin: KafkaAdmin, unique_prefix: str, tmp_path: Path
) -> Iterator[MetasrvProcess]:
    """A `metasrv start -c` child on a fresh SQLite kv (which it migrates itself at start)
    and a migrated SQLite history (which it checks at start and on every /readyz)."""
    kv = {"backend": "sql", "sql_url": f"sqlite:///{tmp_path / 'kv.db'}"}
    history = f"sqlite:///{tmp_path / 'history.db'}"
    sections = settings(unique_prefix, kafka_bootstrap, free_port(), kv, history)
    proc = start_metasrv(tmp_path, "metasrv", sections)
    (tmp_path / "kv.db").unlink(missing_ok=True)  # so the start runs the kv's migrations
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()
        ours = [t for t in kafka_admin.list_topics() if t.startswith(unique_prefix)]
        kafka_admin.delete_topics(ours)


def test_start_logs_no_alembic_info(started: MetasrvProcess) -> None:
    for _ in range(3):  # each /readyz checks the history schema through Alembic
        assert httpx.get(f"{started.url}/readyz", timeout=10).status_code == 200
    started.stop()
    entries = [json.loads(line) for line in started.log_path.read_text().splitlines() if line]
    assert any(e["msg"] == "starting metasrv" for e in entries), started.tail()
    chatter = [
        e["msg"] for e in entries if e["logger"].startswith("alembic") and e["level"] == "info"
    ]
    assert chatter == []
