"""What only the SQL election does: terms that count up from 1 in the lease row, and the
SQLite file that serves one process (the contract every store keeps is `test_election.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

import migrations
from metasrv.election import SqlElection, SqliteFileLeader, build_election
from metasrv.errors import ConfigError
from metasrv.keys import ELECTION_KEY, decode_election
from metasrv.kv import SqlKv
from metasrv.settings import load_settings
from metasrv.sql import election_table
from tests._wait import eventually
from tests.metasrv.election._election import LEASE_SECS, leader_of
from tests.metasrv.kv._pgschema import fresh_schema


@pytest.fixture(params=["postgresql", "sqlite"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated kv database: a fresh PostgreSQL schema, or a SQLite file."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'kv.db'}"
        migrations.upgrade(url)
        yield url
        return
    with fresh_schema(request.getfixturevalue("postgres_url")) as url:
        migrations.upgrade(url)
        yield url


async def test_terms_count_up_from_one(sql_url: str) -> None:
    a, b = (
        SqlElection(sql_url, node_name=f"n{i}", addr=f"127.0.0.1:{4000 + i}", lease_secs=LEASE_SECS)
        for i in range(2)
    )
    kv = SqlKv(sql_url)
    try:
        await a.start()
        await b.start()
        await eventually(lambda: a.is_leader or b.is_leader, "a leader", timeout=10)
        await eventually(lambda: a.term == b.term == 1, "both to know term 1", timeout=5)
        stored = kv.get(ELECTION_KEY)
        assert stored is not None and decode_election(stored.value).term == 1

        first, second = leader_of((a, b))
        await first.stop()  # resigning: the next winner raises the term by one
        await eventually(lambda: second.is_leader, "the takeover", timeout=LEASE_SECS + 5)
        assert second.term == 2

        with kv.engine.begin() as conn:  # the lease row runs out: the next winner raises it again
            conn.execute(update(election_table).values(expires_at=0.0))
        await eventually(
            lambda: any(e.is_leader and e.term == 3 for e in (a, b)),
            "term 3",
            timeout=LEASE_SECS + 5,
        )
    finally:
        await a.stop()
        await b.stop()
        kv.close()


async def test_a_sqlite_file_serves_one_process_and_refuses_a_second(tmp_path: Path) -> None:
    """A SQLite file is led by the process holding its file lock; a lease row renewed
    through SQLite's one writer lock starved behind the daemon's own checkpoint writes."""
    settings = load_settings(election={"lease_secs": 3, "node_name": "n1"})
    sql = SqlKv.open(f"sqlite:///{tmp_path / 'kv.db'}", "p/", create=True)
    try:
        first = build_election(settings, sql, addr="10.1.2.3:4000")
        second = build_election(settings, sql, addr="10.1.2.4:4000")
        assert isinstance(first, SqliteFileLeader) and isinstance(second, SqliteFileLeader)
        await first.start()
        assert first.is_leader and first.leader_addr() == "10.1.2.3:4000"
        with pytest.raises(ConfigError, match="serves one metasrv process"):
            await second.start()
        assert not second.is_leader
        await first.stop()
        await second.start()  # the lock went with the first process's stop
        assert second.is_leader
        await second.stop()
    finally:
        sql.close()
