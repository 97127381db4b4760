"""Leader election on the SQL kv backend: a lease row on real PostgreSQL and on a SQLite file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

import migrations
from metasrv.election import SqlElection, SqliteFileLeader, build_election
from metasrv.errors import ConfigError
from metasrv.keys import ELECTION_KEY
from metasrv.kv import Put, SqlKv
from metasrv.settings import load_settings
from metasrv.sql import election_table
from tests.metasrv.kv._pgschema import fresh_schema
from tests.metasrv.test_election import LEASE_SECS, Recorder, wait_until

Pair = tuple[SqlElection, SqlElection]


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


@pytest.fixture
async def kv(sql_url: str) -> AsyncIterator[SqlKv]:
    store = SqlKv(sql_url)
    yield store
    store.close()


@pytest.fixture
async def pair(sql_url: str) -> AsyncIterator[Pair]:
    """Two started elections on one database, each with its own engine."""
    elections = [
        SqlElection(
            sql_url, node_name=f"node-{i}", addr=f"127.0.0.1:{4000 + i}", lease_secs=LEASE_SECS
        )
        for i in range(2)
    ]
    for e in elections:
        await e.start()
    try:
        yield elections[0], elections[1]
    finally:
        for e in elections:
            await e.stop()


def leader_of(pair: Pair) -> Pair:
    a, b = pair
    assert a.is_leader != b.is_leader
    return (a, b) if a.is_leader else (b, a)


async def test_exactly_one_leader_and_the_follower_names_it(pair: Pair, kv: SqlKv) -> None:
    a, b = pair
    await wait_until(lambda: a.is_leader or b.is_leader, 10, "a leader")
    await wait_until(lambda: a.leader_addr() is not None and b.leader_addr() is not None, 5, "addr")
    for _ in range(int(LEASE_SECS * 2 / 0.1)):  # across several renewals
        assert [a.is_leader, b.is_leader].count(True) == 1
        await asyncio.sleep(0.1)
    leader, follower = leader_of(pair)
    assert follower.leader_addr() == leader.addr == leader.leader_addr()
    assert follower.term == leader.term == 1
    stored = kv.get(ELECTION_KEY)
    assert stored is not None
    assert json.loads(stored.value) == {"node": leader.node_name, "addr": leader.addr, "term": 1}
    # The leader's fence holds; the follower's never does.
    assert kv.txn(leader.fence(), [Put("fenced", b"leader")]).succeeded
    assert not kv.txn(follower.fence(), [Put("fenced", b"follower")]).succeeded
    assert (got := kv.get("fenced")) is not None and got.value == b"leader"


async def test_stopping_the_leader_hands_over_at_once_under_a_new_term(pair: Pair) -> None:
    a, b = pair
    rec = Recorder()
    await wait_until(lambda: a.is_leader or b.is_leader, 10, "a leader")
    leader, follower = leader_of(pair)
    follower.add_listener(rec)
    await leader.stop()
    assert not leader.is_leader
    # Resigning ends the lease row, so no expiry wait: one poll suffices.
    took = await wait_until(lambda: follower.is_leader, LEASE_SECS + 5, "the takeover")
    assert took < LEASE_SECS
    assert follower.term == 2
    await wait_until(lambda: rec.events == [True], 2, "the follower's listener")


async def test_an_expired_lease_is_taken_over_and_the_old_fence_fails(
    pair: Pair, kv: SqlKv
) -> None:
    a, b = pair
    await wait_until(lambda: a.is_leader or b.is_leader, 10, "a leader")
    leader, follower = leader_of(pair)
    lost = Recorder()
    leader.add_listener(lost)
    fence = leader.fence()
    assert kv.txn(fence, [Put("fenced", b"term 1")]).succeeded

    # What a paused leader looks like to the others: its lease row ran out.
    with kv.engine.begin() as conn:
        conn.execute(update(election_table).values(expires_at=0.0))

    await wait_until(lambda: follower.is_leader, LEASE_SECS + 5, "the takeover")
    assert follower.term == 2
    # The deposed leader's writes fail in the store, whatever it still believes.
    assert not kv.txn(fence, [Put("fenced", b"deposed")]).succeeded
    assert (got := kv.get("fenced")) is not None and got.value == b"term 1"
    assert kv.txn(follower.fence(), [Put("fenced", b"term 2")]).succeeded
    # And it notices at its next renewal.
    await wait_until(lambda: False in lost.events, LEASE_SECS + 2, "the step-down")
    assert not leader.is_leader


async def test_a_stalled_event_loop_never_takes_over(sql_url: str, kv: SqlKv) -> None:
    wedged = SqlElection(
        sql_url,
        node_name="wedged",
        addr="127.0.0.1:1",
        lease_secs=LEASE_SECS,
        loop_stalled_for=lambda: 1e9,
    )
    await wedged.start()
    try:
        await asyncio.sleep(1.5)
        assert not wedged.is_leader
        assert kv.get(ELECTION_KEY) is None
    finally:
        await wedged.stop()


async def test_unreachable_database_never_elects() -> None:
    e = SqlElection(
        "postgresql://u:p@127.0.0.1:1/db", node_name="n", addr="127.0.0.1:1", lease_secs=1
    )
    await e.start()
    try:
        await asyncio.sleep(1.5)
        assert not e.is_leader and e.leader_addr() is None
    finally:
        await e.stop()


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
