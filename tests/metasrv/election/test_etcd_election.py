"""What only the etcd election does: a revoked lease fences at once, keepalives through a faulty
network, the event-loop watchdog, and the address a follower names (the contract every store
keeps is `test_election.py`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from metasrv.election import EtcdElection, build_election
from metasrv.keys import ELECTION_KEY
from metasrv.kv import EtcdKv, Put
from metasrv.process import LoopLagMonitor
from metasrv.settings import load_settings
from tests._wait import eventually
from tests.metasrv.election._election import LEASE_SECS, Recorder, leader_of

Pair = tuple[EtcdElection, EtcdElection]


@pytest.fixture
async def etcd_kv(etcd_endpoint: str, unique_prefix: str) -> AsyncIterator[EtcdKv]:
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    yield kv
    kv.delete_prefix("")
    kv.close()


@pytest.fixture
async def pair(etcd_endpoint: str, unique_prefix: str) -> AsyncIterator[Pair]:
    """Two started elections (each with its own client) on one key prefix."""
    kvs = [EtcdKv(etcd_endpoint, f"{unique_prefix}/") for _ in range(2)]
    elections = [
        EtcdElection(kv, node_name=f"node-{i}", addr=f"127.0.0.1:{4000 + i}", lease_secs=LEASE_SECS)
        for i, kv in enumerate(kvs)
    ]
    for e in elections:
        await e.start()
    try:
        yield elections[0], elections[1]
    finally:
        for e in elections:
            await e.stop()
        kvs[0].delete_prefix("")
        for kv in kvs:
            kv.close()


async def test_a_revoked_lease_fences_at_once(pair: Pair, etcd_kv: EtcdKv) -> None:
    a, b = pair
    await eventually(lambda: a.is_leader or b.is_leader, "a leader", timeout=10)
    leader, _ = leader_of(pair)
    fence = leader.fence()
    assert etcd_kv.txn(fence, [Put("fenced", b"while leader")]).succeeded

    etcd_kv.client.revoke_lease(leader.term)

    # The key went with the lease: fenced before the deposed leader even noticed.
    assert not etcd_kv.txn(fence, [Put("fenced", b"after loss")]).succeeded
    stored = etcd_kv.get("fenced")
    assert stored is not None
    assert stored.value == b"while leader"


class TcpProxy:
    """A loopback TCP proxy to etcd whose cut() drops every connection (a network fault)
    and whose hold() delays every byte for a while (a slow network or a slow etcd)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def hold(self, seconds: float) -> None:
        self.flowing.clear()
        await asyncio.sleep(seconds)  # the fault itself: a network this slow for this long
        self.flowing.set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    await self.flowing.wait()
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        await self.server.wait_closed()


async def proxied_election(
    etcd_endpoint: str, prefix: str, lease: int
) -> tuple[TcpProxy, EtcdKv, EtcdElection, Recorder]:
    """A started election that reaches etcd through a `TcpProxy`, with a listener recorder."""
    proxy = TcpProxy(etcd_endpoint)
    kv = EtcdKv(await proxy.start(), f"{prefix}/", timeout=1)
    election = EtcdElection(kv, node_name="n", addr="127.0.0.1:4000", lease_secs=lease)
    recorder = Recorder()
    election.add_listener(recorder)
    await election.start()
    return proxy, kv, election, recorder


async def test_a_keepalive_timing_out_within_the_lease_keeps_leadership(
    etcd_endpoint: str, unique_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    lease = 3  # renewals every 1 s, each with a 1 s deadline
    proxy, kv, e, rec = await proxied_election(etcd_endpoint, unique_prefix, lease)
    try:
        await eventually(lambda: e.is_leader, "leadership", timeout=10)
        term = e.term
        # Start right after a renewal, and hold long enough that the next one times out
        # (1 s later, 1 s deadline), but not so long that its retries outlast the lease.
        renewed = e.lease_deadline
        await eventually(lambda: e.lease_deadline != renewed, "a renewal", timeout=lease)
        await proxy.hold(lease * 0.7)
        assert "keepalive failed, retrying" in caplog.text  # the hold did cost a renewal
        held = e.lease_deadline

        def leading_renewed() -> bool:
            assert e.is_leader and e.term == term
            return e.lease_deadline != held

        # Leading at every poll until a renewal after the hold carries the lease on.
        await eventually(leading_renewed, "a renewal after the hold", timeout=lease)
        assert rec.events == [True]
    finally:
        await e.stop()
        kv.close()


async def test_leader_steps_down_when_keepalives_fail(
    etcd_endpoint: str, unique_prefix: str
) -> None:
    proxy, kv, e, rec = await proxied_election(etcd_endpoint, unique_prefix, LEASE_SECS)
    direct = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    try:
        await eventually(lambda: e.is_leader, "leadership", timeout=10)
        fence = e.fence()

        await proxy.cut()

        # is_leader turns False within one TTL of the last renewal, whatever the RPCs do.
        await eventually(lambda: not e.is_leader, "step-down", timeout=LEASE_SECS + 1)
        await eventually(
            lambda: rec.events == [True, False], "loss announced", timeout=LEASE_SECS + 2
        )
        # and etcd expires the key, so the old fence no longer holds
        await eventually(
            lambda: direct.get(ELECTION_KEY) is None, "key expiry", timeout=LEASE_SECS + 2
        )
        assert not direct.txn(fence, [Put("x", b"1")]).succeeded
    finally:
        await e.stop()
        kv.close()
        direct.delete_prefix("")
        direct.close()


def busy(seconds: float) -> None:
    """Hold the event loop with CPU work (pure Python: it yields the GIL to other threads)."""
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


@pytest.fixture
async def watched(
    etcd_endpoint: str, unique_prefix: str
) -> AsyncIterator[tuple[EtcdElection, EtcdElection, LoopLagMonitor]]:
    """A leader whose watchdog watches this test's event loop, and a follower without one
    (it stands in for another process, whose loop is not the one blocked here)."""
    monitor = LoopLagMonitor()
    await monitor.start()
    kvs = [EtcdKv(etcd_endpoint, f"{unique_prefix}/") for _ in range(2)]
    leader = EtcdElection(
        kvs[0],
        node_name="watched",
        addr="127.0.0.1:4000",
        lease_secs=LEASE_SECS,
        loop_stalled_for=monitor.stalled_for,
    )
    follower = EtcdElection(kvs[1], node_name="other", addr="127.0.0.1:4001", lease_secs=LEASE_SECS)
    await leader.start()
    try:
        await eventually(lambda: leader.is_leader, "leadership", timeout=10)
        await follower.start()
        await eventually(
            lambda: follower.leader_addr() == leader.addr, "the follower to see it", timeout=5
        )
        yield leader, follower, monitor
    finally:
        await leader.stop()
        await follower.stop()
        await monitor.stop()
        kvs[0].delete_prefix("")
        for kv in kvs:
            kv.close()


async def test_a_busy_event_loop_keeps_leadership(
    watched: tuple[EtcdElection, EtcdElection, LoopLagMonitor],
) -> None:
    leader, follower, monitor = watched
    rec = Recorder()
    leader.add_listener(rec)
    term = leader.term

    busy(2 * LEASE_SECS)  # twice the lease, below the watchdog's 3x

    assert monitor.stalled_for() >= 2 * LEASE_SECS - 0.5
    assert leader.is_leader and leader.term == term
    assert not follower.is_leader
    renewed = leader.lease_deadline

    def leading_renewed() -> bool:
        assert leader.is_leader and leader.term == term
        return leader.lease_deadline != renewed

    # And it stays so, with no step-down queued behind: the loop runs its queue while
    # a renewal goes by.
    await eventually(leading_renewed, "a renewal after the busy loop", timeout=LEASE_SECS)
    assert rec.events == []
    assert monitor.max_lag >= 2 * LEASE_SECS - 0.5


async def test_a_wedged_event_loop_hands_over_past_the_watchdog(
    watched: tuple[EtcdElection, EtcdElection, LoopLagMonitor],
    etcd_endpoint: str,
    unique_prefix: str,
) -> None:
    leader, follower, _ = watched
    rec = Recorder()
    leader.add_listener(rec)
    term = leader.term
    fence = leader.fence()
    assert leader.watchdog_secs == 3 * LEASE_SECS

    busy(leader.watchdog_secs + LEASE_SECS + 1.5)  # past the bound, then time to hand over

    assert not leader.is_leader
    assert follower.is_leader and follower.term != term
    await eventually(lambda: rec.events == [False], "the loss to be announced", timeout=2)
    direct = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    try:
        assert not direct.txn(fence, [Put("after-wedge", b"1")]).succeeded
    finally:
        direct.close()
    # Once the loop runs again it may lead again later, but never under the old term.
    await eventually(lambda: leader.term != term, "the old leader sees a new term")
    assert not (leader.is_leader and follower.is_leader)


async def test_a_follower_names_the_advertised_address_of_a_leader_bound_to_every_interface(
    etcd_endpoint: str, unique_prefix: str
) -> None:
    """#12: a leader bound to 0.0.0.0 is named by its `http.advertise_addr`, not by the
    wildcard or its host name, in what followers answer (421s and the heartbeat's leader)."""
    kvs = [EtcdKv(etcd_endpoint, f"{unique_prefix}/") for _ in range(2)]
    bound_everywhere = load_settings(
        http={"addr": "0.0.0.0:4123", "advertise_addr": "10.9.8.7:4123"},
        election={"lease_secs": LEASE_SECS, "node_name": "leader"},
    )
    leader = build_election(bound_everywhere, kvs[0])
    follower = EtcdElection(kvs[1], node_name="follower", addr="127.0.0.1:4999", lease_secs=3)
    try:
        await leader.start()
        await eventually(lambda: leader.is_leader, "the first election leads", timeout=10)
        await follower.start()
        await eventually(
            lambda: follower.leader_addr() is not None, "the follower sees it", timeout=10
        )
        assert not follower.is_leader
        assert follower.leader_addr() == "10.9.8.7:4123"
    finally:
        await follower.stop()
        await leader.stop()
        kvs[0].delete_prefix("")
        for kv in kvs:
            kv.close()
