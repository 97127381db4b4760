"""Ready means ready: `/readyz` is 503 while the history database lacks its schema, `metasrv
start` logs the exact `metasrv db upgrade` command, and the embedded default (no config
file) migrates its own SQLite files. Real daemons, real PostgreSQL and Kafka."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, inspect

from tests._wait import wait_until
from tests.api.conftest import readyz_checks
from tests.metasrv.kv._pgschema import fresh_schema
from toolbox.simulator import MetasrvProcess, free_port, metasrv_argv


@pytest.fixture
def daemons() -> Iterator[list[MetasrvProcess]]:
    started: list[MetasrvProcess] = []
    yield started
    for daemon in started:
        daemon.stop(timeout=20)


def readyz(port: int, timeout: float = 60) -> httpx.Response:
    """The first answer of `/readyz` once Kafka's check passes (the daemon may still be
    starting, and the partitions of a pool it has just created may have no leader yet)."""

    def kafka_checked() -> httpx.Response | None:
        resp = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        return resp if readyz_checks(resp)["kafka"] == "ok" else None

    return wait_until(
        kafka_checked,
        "/readyz with Kafka's check passing",
        timeout=timeout,
        interval=0.2,
        ignore=(httpx.TransportError,),
    )


def test_unmigrated_postgres_history_is_not_ready_until_db_upgrade(
    tmp_path: Path,
    postgres_url: str,
    kafka_bootstrap: str,
    daemons: list[MetasrvProcess],
) -> None:
    port = free_port()
    with fresh_schema(postgres_url) as history:
        config = tmp_path / "metasrv.toml"
        config.write_text(
            f'[wal]\nbroker_endpoints = ["{kafka_bootstrap}"]\n'
            f'[http]\naddr = "127.0.0.1:{port}"\n'
            f'[kv]\nsql_url = "sqlite:///{tmp_path / "kv.db"}"\n'
            f'[history]\nurl = "{history}"\n'
        )
        daemon = MetasrvProcess(config, tmp_path / "metasrv.log", f"http://127.0.0.1:{port}")
        daemons.append(daemon)
        daemon.spawn()
        resp = readyz(port)
        assert resp.status_code == 503, resp.text
        body = resp.json()
        assert body["error"]["checks"]["history"] == (
            "history database has no schema: run `metasrv db upgrade`"
        )
        assert body["error"]["checks"]["kv"] == "ok" and body["error"]["checks"]["kafka"] == "ok"
        # The reason names neither the database's address nor its credentials.
        pg = httpx.URL(postgres_url.replace("+psycopg", ""))
        for secret in (pg.host, f":{pg.port}", f"{pg.username}:{pg.password}@", "search_path"):
            assert secret not in resp.text
        ((_, warning),) = daemon.log_records("history database not migrated")
        assert warning["command"] == f"metasrv db upgrade -c {config.resolve()}"

        upgraded = subprocess.run(
            metasrv_argv("db", "upgrade", "--url", history), capture_output=True, timeout=120
        )
        assert upgraded.returncode == 0, upgraded.stderr
        resp = readyz(port)
        assert resp.status_code == 200, resp.text
        assert resp.json()["checks"]["history"] == "ok"
        daemons.pop().stop()


def test_the_embedded_default_creates_its_sqlite_schemas(
    tmp_path: Path, kafka_bootstrap: str, daemons: list[MetasrvProcess]
) -> None:
    port = free_port()
    env = {
        "METASRV_HTTP__ADDR": f"127.0.0.1:{port}",
        "METASRV_WAL__BROKER_ENDPOINTS": f'["{kafka_bootstrap}"]',
        "METASRV_RECONCILE__STAT_HISTORY_INTERVAL": "0s",
    }
    daemon = MetasrvProcess(
        None, tmp_path / "metasrv.log", f"http://127.0.0.1:{port}", env=env, cwd=tmp_path
    )
    daemons.append(daemon)
    daemon.spawn()
    resp = readyz(port)
    assert resp.status_code == 200, resp.text
    assert resp.json()["checks"] == {
        "kv": "ok",
        "kafka": "ok",
        "history": "ok",
        "background_tasks": "ok",
    }
    engine = create_engine(f"sqlite:///{tmp_path / 'metasrv-history.db'}")
    try:
        assert {"purge_history", "procedure_history", "wal_events"} <= set(
            inspect(engine).get_table_names()
        )
    finally:
        engine.dispose()
