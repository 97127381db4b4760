"""Ready means ready: `/readyz` is 503 while the history database lacks its schema, `metasrv
start` logs the exact `metasrv db upgrade` command, and the embedded default (no config
file) migrates its own SQLite files. Real daemons, real PostgreSQL and Kafka."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, inspect

from tests.api.conftest import free_port
from tests.api.test_failover import METASRV
from tests.metasrv.kv._pgschema import fresh_schema


@pytest.fixture
def daemons() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def readyz(port: int, timeout: float = 60) -> httpx.Response:
    """The first answer of `/readyz` once Kafka's check passes (the daemon may still be
    starting, and the partitions of a pool it has just created may have no leader yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            resp = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        body = resp.json()
        checks = body["checks"] if resp.status_code == 200 else body["error"]["checks"]
        if checks["kafka"] == "ok" or time.monotonic() > deadline:
            return resp
        time.sleep(0.2)


def test_unmigrated_postgres_history_is_not_ready_until_db_upgrade(
    tmp_path: Path,
    postgres_url: str,
    kafka_bootstrap: str,
    daemons: list[subprocess.Popen[bytes]],
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
        log = tmp_path / "metasrv.log"
        with log.open("wb") as out:
            daemons.append(
                subprocess.Popen(
                    [METASRV, "start", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT
                )
            )
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
        records = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        (warning,) = [r for r in records if r["msg"].startswith("history database not migrated")]
        assert warning["command"] == f"metasrv db upgrade -c {config.resolve()}"

        upgraded = subprocess.run(
            [METASRV, "db", "upgrade", "--url", history], capture_output=True, timeout=120
        )
        assert upgraded.returncode == 0, upgraded.stderr
        resp = readyz(port)
        assert resp.status_code == 200, resp.text
        assert resp.json()["checks"]["history"] == "ok"
        daemons.pop().terminate()


def test_the_embedded_default_creates_its_sqlite_schemas(
    tmp_path: Path, kafka_bootstrap: str, daemons: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "METASRV_HTTP__ADDR": f"127.0.0.1:{port}",
        "METASRV_WAL__BROKER_ENDPOINTS": f'["{kafka_bootstrap}"]',
        "METASRV_RECONCILE__STAT_HISTORY_INTERVAL": "0s",
    }
    with (tmp_path / "metasrv.log").open("wb") as out:
        daemons.append(
            subprocess.Popen(
                [METASRV, "start"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        )
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
