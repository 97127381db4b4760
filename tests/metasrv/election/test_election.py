"""The election contract, on every store that elects among processes: etcd (a lease) and SQL
(a lease row, on PostgreSQL and on a SQLite file).

What only one backend does is tested beside it: `test_etcd_election.py` (a revoked lease
fences at once, keepalives through a faulty network, the event-loop watchdog, the advertised
address) and `test_sql_election.py` (terms that count from 1, the SQLite file leader). The
single-process leader and `build_election` are at the end of this file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

import pytest
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import update

import migrations
from metasrv.election import (
    EtcdElection,
    LeaseOptions,
    SingleLeader,
    SqlElection,
    build_election,
)
from metasrv.errors import ConfigError
from metasrv.keys import ELECTION_KEY
from metasrv.kv import EtcdKv, KvBackend, Put, SqlKv
from metasrv.process import Supervisor
from metasrv.settings import load_settings
from metasrv.sql import election_table
from tests._wait import eventually
from tests.metasrv.election._election import LEASE_SECS, Recorder, leader_of
from tests.metasrv.kv._pgschema import fresh_schema

Lease = EtcdElection | SqlElection
Pair = tuple[Lease, Lease]

BACKENDS = ["etcd", "postgresql", "sqlite"]


@dataclass
class Store:
    """One backend's store for a test."""

    kv: KvBackend
    """A kv on the store and key prefix the elections use (to read the key, to try fences)."""
    election: Callable[..., Lease]
    """`election(node_name, addr, **options)`: a new election with a connection of its own."""
    expire: Callable[[Lease], None]
    """Make the leader's lease run out under it, as a paused leader's does."""
    unreachable: Callable[[], Lease]
    """An election whose store never answers."""


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: str) -> Iterator[Store]:
    with ExitStack() as stack:
        if request.param == "etcd":
            endpoint: str = request.getfixturevalue("etcd_endpoint")
            etcd = EtcdKv(endpoint, f"{unique_prefix}/")
            stack.callback(etcd.close)
            stack.callback(etcd.delete_prefix, "")

            def etcd_election(node: str, addr: str, **options: Unpack[LeaseOptions]) -> Lease:
                own = EtcdKv(endpoint, f"{unique_prefix}/")
                stack.callback(own.close)
                options.setdefault("lease_secs", LEASE_SECS)
                return EtcdElection(own, node_name=node, addr=addr, **options)

            def revoke(leader: Lease) -> None:
                etcd.client.revoke_lease(leader.term)

            def no_etcd() -> Lease:
                nowhere = EtcdKv("127.0.0.1:1", timeout=1)
                stack.callback(nowhere.close)
                return EtcdElection(
                    nowhere, node_name="n", addr="127.0.0.1:1", lease_secs=LEASE_SECS
                )

            yield Store(etcd, etcd_election, revoke, no_etcd)
            return

        if request.param == "postgresql":
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
            nowhere_url = "postgresql://u:p@127.0.0.1:1/db"
        else:
            url = f"sqlite:///{tmp_path / 'kv.db'}"
            nowhere_url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'kv.db'}"
        migrations.upgrade(url)
        sql = SqlKv(url)
        stack.callback(sql.close)

        def sql_election(node: str, addr: str, **options: Unpack[LeaseOptions]) -> Lease:
            options.setdefault("lease_secs", LEASE_SECS)
            return SqlElection(url, node_name=node, addr=addr, **options)

        def run_out(leader: Lease) -> None:
            with sql.engine.begin() as conn:
                conn.execute(update(election_table).values(expires_at=0.0))

        def no_database() -> Lease:
            return SqlElection(nowhere_url, node_name="n", addr="127.0.0.1:1", lease_secs=1)

        yield Store(sql, sql_election, run_out, no_database)


@pytest.fixture
async def pair(store: Store) -> AsyncIterator[Pair]:
    """Two started elections on one store, each with its own connection."""
    elections = [store.election(f"node-{i}", f"127.0.0.1:{4000 + i}") for i in range(2)]
    for e in elections:
        await e.start()
    try:
        yield elections[0], elections[1]
    finally:
        for e in elections:
            await e.stop()


async def test_exactly_one_leader_and_the_follower_names_it(pair: Pair, store: Store) -> None:
    a, b = pair
    await eventually(lambda: a.is_leader or b.is_leader, "a leader", timeout=10)
    await eventually(
        lambda: a.leader_addr() is not None and b.leader_addr() is not None, "addr", timeout=5
    )
    leader, _ = leader_of(pair)
    for _ in range(2):  # exactly one leader at every poll, across two renewals
        renewed = leader.lease_deadline

        def one_leader_renewed() -> bool:
            assert [a.is_leader, b.is_leader].count(True) == 1
            return leader.lease_deadline != renewed  # noqa: B023 (called in this iteration)

        await eventually(one_leader_renewed, "a renewal", timeout=LEASE_SECS)
    leader, follower = leader_of(pair)
    assert follower.leader_addr() == leader.addr == leader.leader_addr()
    assert follower.term == leader.term != 0
    stored = store.kv.get(ELECTION_KEY)
    assert stored is not None
    assert json.loads(stored.value) == {
        "node": leader.node_name,
        "addr": leader.addr,
        "term": leader.term,
    }
    # The leader's fence holds; the follower's never does.
    assert store.kv.txn(leader.fence(), [Put("fenced", b"leader")]).succeeded
    assert not store.kv.txn(follower.fence(), [Put("fenced", b"follower")]).succeeded
    assert (got := store.kv.get("fenced")) is not None and got.value == b"leader"


async def test_stopping_the_leader_hands_over_at_once_under_a_new_term(pair: Pair) -> None:
    a, b = pair
    rec = {id(a): Recorder(), id(b): Recorder()}
    a.add_listener(rec[id(a)])
    b.add_listener(rec[id(b)])
    await eventually(lambda: a.is_leader or b.is_leader, "a leader", timeout=10)
    leader, follower = leader_of(pair)
    old_term = leader.term

    await leader.stop()

    assert not leader.is_leader
    # Resigning ends the lease, so the follower needs no expiry wait: one poll suffices.
    await eventually(lambda: follower.is_leader, "the follower to take over", timeout=LEASE_SECS)
    assert follower.term != old_term
    await eventually(
        lambda: rec[id(follower)].events == [True], "the follower's listener", timeout=2
    )
    assert rec[id(leader)].events in ([True, False], [False])  # registered after its win, maybe
    assert rec[id(leader)].events[-1] is False


async def test_a_lease_that_runs_out_deposes_the_leader_and_its_fence(
    pair: Pair, store: Store
) -> None:
    a, b = pair
    await eventually(lambda: a.is_leader or b.is_leader, "a leader", timeout=10)
    leader, _ = leader_of(pair)
    lost = Recorder()
    leader.add_listener(lost)
    deposed = leader.term
    fence = leader.fence()
    assert store.kv.txn(fence, [Put("fenced", b"before")]).succeeded

    store.expire(leader)

    await eventually(
        lambda: not leader.is_leader or leader.term != deposed, "step-down", timeout=LEASE_SECS + 1
    )
    await eventually(lambda: False in lost.events, "the loss to be announced", timeout=2)

    def new_term() -> bool:
        return any(e.is_leader and e.term != deposed for e in pair) and not (
            a.is_leader and b.is_leader
        )

    await eventually(new_term, "a leader under a new term", timeout=LEASE_SECS + 5)
    new_leader, _ = leader_of(pair)
    # The deposed term's writes fail in the store, whatever its process still believes.
    assert not store.kv.txn(fence, [Put("fenced", b"deposed")]).succeeded
    assert (got := store.kv.get("fenced")) is not None and got.value == b"before"
    assert store.kv.txn(new_leader.fence(), [Put("fenced", b"new term")]).succeeded


async def test_the_fence_of_a_never_elected_process_never_holds(store: Store) -> None:
    e = store.election("n", "127.0.0.1:1")
    assert not e.is_leader
    assert e.leader_addr() is None
    assert not store.kv.txn(e.fence(), [Put("x", b"1")]).succeeded


async def test_an_unreachable_store_never_elects(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    e = store.unreachable()
    caplog.set_level(logging.WARNING, logger="metasrv.election")
    await e.start()
    try:
        await eventually(
            lambda: len(_election_errors(caplog)) >= 2, "two failed campaigns", timeout=15
        )
        assert not e.is_leader
        assert e.leader_addr() is None
    finally:
        await e.stop()


async def test_a_stalled_event_loop_never_takes_over(store: Store) -> None:
    asked = 0

    def stalled_for() -> float:
        nonlocal asked
        asked += 1
        return 1e9

    wedged = store.election("wedged", "127.0.0.1:1", loop_stalled_for=stalled_for)
    await wedged.start()
    try:
        # Asked only by a campaign that found the lease free: twice, and it never took it.
        await eventually(lambda: asked >= 2, "two campaigns on a free lease", timeout=15)
        assert not wedged.is_leader
        assert store.kv.get(ELECTION_KEY) is None
    finally:
        await wedged.stop()


async def test_an_election_thread_that_dies_is_reported_by_its_supervisor(store: Store) -> None:
    # A bug outside a round's retry (here: stepping down fails after a renewal failed)
    # ends the thread; the process would never campaign again, so it must not go unseen.
    e = store.election("n", "127.0.0.1:1")

    def renewal_bug() -> str | None:
        raise RuntimeError("renewal bug")

    def release_bug() -> None:
        raise RuntimeError("release bug")

    e._renew_lease = renewal_bug  # type: ignore[method-assign]
    e._release = release_bug  # type: ignore[method-assign]
    registry = CollectorRegistry()
    errors = Counter("metasrv_background_task_errors", "", ["task"], registry=registry)
    background = Supervisor(errors)
    background.add("election", e)
    async with background:
        await eventually(lambda: e.is_leader, "the election won", timeout=10)
        await eventually(lambda: background.dead() == ["election"], "a dead election")
        task = e.task
        assert task is not None and task.done()
        assert str(task.exception()) == "release bug"
        assert (
            registry.get_sample_value("metasrv_background_task_errors_total", {"task": "election"})
            == 1
        )
    assert e.task is None  # stopped: the lease ends by itself


def _election_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("election: ")]


# -- beside the contract: no store, and the builder ---------------------------------------------


async def test_single_leader() -> None:
    e = SingleLeader(node_name="solo", addr="127.0.0.1:4000")
    rec = Recorder()
    e.add_listener(rec)
    assert not e.is_leader
    await e.start()
    assert e.is_leader
    assert e.leader_addr() == "127.0.0.1:4000"
    assert e.fence() == []
    await e.stop()
    assert not e.is_leader
    assert rec.events == [True, False]


async def test_build_election_picks_by_backend(etcd_endpoint: str, unique_prefix: str) -> None:
    settings = load_settings(
        http={"addr": "0.0.0.0:4123"}, election={"lease_secs": 3, "node_name": "n1"}
    )
    etcd_kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    try:
        etcd = build_election(settings, etcd_kv)
        assert isinstance(etcd, EtcdElection)
        assert (etcd.lease_secs, etcd.node_name) == (3, "n1")
        assert etcd.addr.endswith(":4123") and not etcd.addr.startswith("0.0.0.0")

        advertised = load_settings(
            http={"addr": "0.0.0.0:4123", "advertise_addr": "10.9.8.7:4123"},
            election={"lease_secs": 3, "node_name": "n1"},
        )
        assert build_election(advertised, etcd_kv).leader_addr() is None  # not leading yet
        built = build_election(advertised, etcd_kv)
        assert isinstance(built, EtcdElection) and built.addr == "10.9.8.7:4123"
    finally:
        etcd_kv.close()
    with pytest.raises(ConfigError):
        load_settings(http={"advertise_addr": "no-port"})

    # Only an in-memory kv, which no other process can reach, has no election.
    sql = SqlKv.open("sqlite://", create=True)
    try:
        single = build_election(settings, sql, addr="10.1.2.3:4000")
        assert isinstance(single, SingleLeader)
        assert single.addr == "10.1.2.3:4000"
    finally:
        sql.close()
