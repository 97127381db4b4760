"""The load generator of `load.py`: pre-encoded heartbeats over raw keep-alive HTTP/1.1.

One generator process drives a range of `load.py`'s synthetic datanodes (`--node-range`)
and writes what it saw to `--out-file` (+ `.lat`), in the same shape as the httpx
generator (`load.py --generator httpx`), so `load.py` reports both alike. It is built so
that its own CPU stays small beside the leader's on a 2-core box:

- **Bodies are encoded once.** Columns (`--encoding columns`): each datanode's body is
  encoded at start with `metasrv.wire.encode_columns` (topic reports left out) into a
  bytearray. Each int64 column is a msgpack `bin` at a fixed offset; the offsets are found
  once (the column's key, then its bin header, checked against the encoded values) and
  numpy arrays are made as views into the bytearray, so moving a region forward is a store
  into the body itself. The topic reports come last in the body (`encode_columns` puts
  them there) and are the only part whose length varies (msgpack integers are variable
  length): they are encoded once per high-watermark read for each set of topics and sent
  as a second buffer after the body, whose trailing nil (`topics: null`) is cut off.
  JSON (`--encoding json`): each region's object is kept as an encoded fragment; a
  heartbeat re-renders only the moved regions' fragments and joins them.
- **Stats move forward as `--change` asks.** Each datanode walks a fixed random permutation
  of its regions, `max(1, round(change x regions))` of them per heartbeat, so every region
  moves once every 1/change heartbeats. A busy region's `flushed_entry_id` goes to
  max(itself, its topic's latest id - a random lag of 0-50), its `memtable_bytes` to a
  random 1 KiB - 4 MiB and its `manifest_version` up by one; an idle region's
  `topic_latest_entry_id` (every 4th region) goes to max(itself, its topic's latest id).
  Nothing goes backwards. The random values come from pools drawn once per process. The
  topics' latest ids are their Kafka high watermarks, read every 5 s on a worker thread,
  as in the httpx generator.
- **Raw connections.** One keep-alive HTTP/1.1 connection per datanode (an asyncio
  `Protocol` on uvloop), opened on first use and again after the server closes it. A
  request is one `writelines` of the request head and the body's buffers (the
  `authorization: Bearer` header when a token is given); the answer is parsed by its
  status line and `content-length` only. A 200's JSON is read for its `rejected` list. A
  421 carries `{"error": {"code": "not_leader", "leader": "host:port" | null, ...}}`
  (api/errors.py): the datanode moves to the named leader when it names another address,
  as a datanode does; null or its own address means an election is under way.
- **Scheduling.** One timer per datanode on the loop: a heartbeat every `--interval` s from
  a random phase; a datanode whose answer came more than a whole interval late skips the
  intervals it missed and counts them (`missed`), as the httpx generator does.
- **Measured cheaply.** Latency is `time.monotonic()` from just before the request is
  handed to the connection (the connect included when the connection had to be opened) to
  the answer's last byte, appended to an `array('d')`. The generator's CPU is
  `getrusage(RUSAGE_SELF)` user + system (every thread, the high-watermark reader's and
  the Kafka client's included) from after the bodies are built to the end of the run, as
  `cpu_seconds`.

Measuring its CPU at the design load against a real leader (`load.py` starts a leader and a
follower with `metasrv start` on the shared etcd and Kafka; the table's "generator CPU
(cores)" is the generator processes' CPU seconds summed over the run, divided by the
duration; the JSON keeps `loadavg_1m_end` beside it, as the box may be shared):

    .venv/bin/python benchmarks/load.py --duration 90 --nodes 1000 --regions 1000 \
        --interval 3 --encoding columns                       # this generator
    .venv/bin/python benchmarks/load.py --duration 90 --nodes 1000 --regions 1000 \
        --interval 3 --encoding columns --generator httpx     # asyncio + httpx, same load
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import gc
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import msgspec
import numpy as np
import orjson

from metasrv.wire import NULL, encode_columns

NODE_BASE = 10_000
"""Synthetic datanode ids start here (as in load.py)."""
IDLE_EVERY = 4
"""Every 4th synthetic region is idle."""
HW_REFRESH = 5.0
"""Seconds between reads of the topics' high watermarks."""
REQUEST_TIMEOUT = 30.0
"""Seconds a request may take before it counts as `Timeout` and its connection is closed."""
MAX_LAG = 50
"""A busy region's flushed id trails its topic's latest id by 0..MAX_LAG."""
CONTENT_TYPES = {"json": b"application/json", "columns": b"application/msgpack"}


def region_id(node: int, index: int) -> int:
    """DESIGN §1 layout: table id = NODE_BASE + node, region number = index."""
    return ((NODE_BASE + node) << 32) | index


# --- bodies -------------------------------------------------------------------------------


class Topics:
    """The topics' latest entry ids (Kafka high watermark - 1) and each topic set's encoded
    `topics` reports, re-encoded once per high-watermark read."""

    def __init__(self, names: list[str], encoding: str) -> None:
        self.names = names
        self.latest = np.full(len(names), -1, np.int64)
        self._json = encoding == "json"
        self._reports: dict[tuple[int, ...], bytes] = {}

    def update(self, offsets: dict[str, int]) -> None:
        """New high watermarks (topic -> high watermark); latest ids never go back."""
        for i, name in enumerate(self.names):
            if name in offsets:
                self.latest[i] = max(self.latest[i], offsets[name] - 1)
        self._reports = {}

    def reports(self, used: tuple[int, ...]) -> bytes:
        """The encoded `topics` list of a datanode reporting the topics `used`."""
        encoded = self._reports.get(used)
        if encoded is None:
            latest = self.latest.tolist()
            items = [
                {
                    "topic": self.names[t],
                    "latest_entry_id": latest[t],
                    "record_size": 0,
                    "record_num": 0,
                }
                for t in used
            ]
            encoded = orjson.dumps(items) if self._json else msgspec.msgpack.encode(items)
            self._reports[used] = encoded
        return encoded


class Draws:
    """Random lags and memtable sizes drawn once, handed out as rotating slices (a numpy
    draw per heartbeat costs more than the rest of moving the regions)."""

    SIZE = 1 << 16

    def __init__(self, rng: np.random.Generator) -> None:
        self.lag = rng.integers(0, MAX_LAG, self.SIZE, endpoint=True)
        self.memtable = rng.integers(1024, 4 << 20, self.SIZE, endpoint=True)
        self._at = 0

    def take(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`k` lags and `k` memtable sizes (k <= SIZE // 2)."""
        at = self._at
        self._at = (at + k) % (self.SIZE - k)
        return self.lag[at : at + k], self.memtable[at : at + k]


def _column_view(body: bytearray, name: str, values: np.ndarray) -> np.ndarray:
    """A writable int64 view of the column `name` inside the encoded `body`."""
    n = len(values)
    size = 8 * n
    if size <= 0xFF:
        header = b"\xc4" + size.to_bytes(1, "big")
    elif size <= 0xFFFF:
        header = b"\xc5" + size.to_bytes(2, "big")
    else:
        header = b"\xc6" + size.to_bytes(4, "big")
    marker = msgspec.msgpack.encode(name) + header
    at = body.find(marker)
    while at >= 0:
        offset = at + len(marker)
        view = np.frombuffer(body, dtype="<i8", count=n, offset=offset)
        if np.array_equal(view, values):
            return view
        at = body.find(marker, at + 1)
    raise ValueError(f"column {name} not found in the encoded heartbeat")


class Node:
    """One datanode's regions, their stats, and its heartbeat body kept encoded."""

    def __init__(
        self,
        node: int,
        args: argparse.Namespace,
        topics: Topics,
        rng: np.random.Generator,
        draws: Draws,
    ) -> None:
        n = args.regions
        self.node_id = NODE_BASE + node
        self.topics = topics
        self.draws = draws
        self.encoding = args.encoding
        index = np.arange(n, dtype=np.int64)
        #: Each region's topic, as an index into `topics.names` (load.py's `topic_of`).
        self.topic = (node * n + index) % len(topics.names)
        self.idle = index % IDLE_EVERY == 0
        self.used = tuple(sorted(set(self.topic.tolist())))
        self.count = max(1, round(n * args.change))
        self._walk = np.tile(rng.permutation(n), 2)
        self._cursor = 0
        # Every region observed once, after the first high-watermark read (load.py's prime).
        latest = topics.latest[self.topic]
        lag = rng.integers(0, MAX_LAG, n, endpoint=True)
        flushed = np.where(self.idle, -1, np.maximum(-1, latest - lag))
        memtable = np.where(self.idle, 0, rng.integers(1024, 4 << 20, n, endpoint=True))
        topic_latest = np.where(self.idle, np.maximum(-1, latest), NULL)
        manifest = np.where(self.idle, 1, 2)
        ids = [region_id(node, i) for i in range(n)]
        names = [topics.names[t] for t in self.topic.tolist()]
        addr = f"10.{node // 250}.{node % 250}.1:4001"
        if self.encoding == "columns":
            regions = list(
                zip(
                    ids,
                    names,
                    flushed.tolist(),
                    [None if v == NULL else v for v in topic_latest.tolist()],
                    memtable.tolist(),
                    manifest.tolist(),
                    strict=True,
                )
            )
            encoded = encode_columns(self.node_id, addr, regions, topics=None)
            # encode_columns writes `topics` last: cut its nil, the reports follow the body.
            if not encoded.endswith(msgspec.msgpack.encode("topics") + b"\xc0"):
                raise ValueError("encode_columns no longer ends with the topics field")
            self.body = bytearray(encoded[:-1])
            self.flushed = _column_view(self.body, "flushed_entry_id", flushed)
            self.memtable = _column_view(self.body, "memtable_bytes", memtable)
            self.latest = _column_view(self.body, "topic_latest_entry_id", topic_latest)
            self.manifest = _column_view(self.body, "manifest_version", manifest)
        else:
            self.flushed, self.memtable = flushed, memtable
            self.latest, self.manifest = topic_latest, manifest
            self._templates = [
                b'{"region_id":%d,"topic":%b,"flushed_entry_id":%%d,' % (rid, orjson.dumps(name))
                + (b'"topic_latest_entry_id":%d,' if idle else b'"topic_latest_entry_id":null,')
                + b'"memtable_bytes":%d,"manifest_version":%d}'
                for rid, name, idle in zip(ids, names, self.idle.tolist(), strict=True)
            ]
            self._fragments = [b""] * n
            self._render(index)
            self._head = b'{"node_id":%d,"addr":%b,"regions":[' % (
                self.node_id,
                orjson.dumps(addr),
            )

    def _render(self, moved: np.ndarray) -> None:
        """Re-render the JSON fragments of the `moved` regions."""
        rows = zip(
            moved.tolist(),
            self.idle[moved].tolist(),
            self.flushed[moved].tolist(),
            self.latest[moved].tolist(),
            self.memtable[moved].tolist(),
            self.manifest[moved].tolist(),
            strict=True,
        )
        templates, fragments = self._templates, self._fragments
        for i, idle, flushed, latest, memtable, manifest in rows:
            values = (
                (flushed, latest, memtable, manifest) if idle else (flushed, memtable, manifest)
            )
            fragments[i] = templates[i] % values

    def advance(self) -> list[bytes | bytearray]:
        """Move the next `count` regions of the walk forward; the next heartbeat's buffers."""
        n = len(self.topic)
        moved = self._walk[self._cursor : self._cursor + self.count]
        self._cursor = (self._cursor + self.count) % n
        idle = self.idle[moved]
        quiet, busy = moved[idle], moved[~idle]
        latest = self.topics.latest
        if quiet.size:
            self.latest[quiet] = np.maximum(self.latest[quiet], latest[self.topic[quiet]])
        if busy.size:
            lag, memtable = self.draws.take(busy.size)
            self.flushed[busy] = np.maximum(self.flushed[busy], latest[self.topic[busy]] - lag)
            self.memtable[busy] = memtable
            self.manifest[busy] += 1
        return self.buffers(moved)

    def buffers(self, moved: np.ndarray | None = None) -> list[bytes | bytearray]:
        """The heartbeat as it stands (JSON fragments of `moved` re-rendered first)."""
        reports = self.topics.reports(self.used)
        if self.encoding == "columns":
            return [self.body, reports]
        if moved is not None:
            self._render(moved)
        return [self._head, b",".join(self._fragments), b'],"topics":', reports, b"}"]


# --- connections --------------------------------------------------------------------------


class Exchange(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time; the answer is
    parsed by its status line and `content-length` only."""

    def __init__(
        self, answered: Callable[[int, bytes], None], failed: Callable[[str], None]
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self._answered = answered
        self._failed = failed
        self._buf = bytearray()
        self._end = -1  # where the answer ends in _buf; -1: head not read yet
        self._body_at = 0
        self._status = 0
        self._close_after = False
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, buffers: list[bytes | bytearray]) -> None:
        assert self.transport is not None
        self.busy = True
        self.transport.writelines(buffers)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if self._end < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(buf[:head_end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if not head.startswith(b"http/1.1 ") or at < 0:
                self._fail("BadResponse")
                return
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else head_end])
            self._status = int(head[9:12])
            self._close_after = b"\r\nconnection: close" in head
            self._body_at = head_end + 4
            self._end = self._body_at + length
        if len(buf) < self._end:
            return
        body = bytes(buf[self._body_at : self._end])
        del buf[: self._end]
        self._end = -1
        self.busy = False
        if self._close_after and self.transport is not None:
            self.transport.close()
        self._answered(self._status, body)

    def _fail(self, reason: str) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.busy:
            self.busy = False
            self._failed(reason)

    def abort(self, reason: str) -> None:
        """Give up on the request in flight (its connection is closed)."""
        self._fail(reason)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.busy:
            self.busy = False
            self._failed("ConnectionLost")


def _addr(url_or_addr: str) -> tuple[str, int]:
    parts = urlsplit(url_or_addr if "//" in url_or_addr else f"http://{url_or_addr}")
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


class Target:
    """Where a client sends: address and the request head's fixed part."""

    def __init__(self, addr: tuple[str, int], content_type: bytes, token: str | None) -> None:
        self.addr = addr
        auth = b"authorization: Bearer %b\r\n" % token.encode() if token else b""
        self.head = (
            b"POST /v1/heartbeat HTTP/1.1\r\nhost: %b:%d\r\ncontent-type: %b\r\n%bcontent-length: "
        ) % (addr[0].encode(), addr[1], content_type, auth)


# --- the run --------------------------------------------------------------------------------


class Stats:
    """What one generator process saw (load.py's client JSON)."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.rejected_regions: dict[str, int] = {}
        self.region_stats = 0
        self.missed = 0
        self.follower: dict[str, int] = {}
        self.times: array.array[float] = array.array("d")
        self.latencies: array.array[float] = array.array("d")
        self.error_times: list[float] = []
        self.leader_switches = 0

    def error(self, key: str, at: float) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1
        self.error_times.append(at)


class Generator:
    """Every datanode of this process on one event loop."""

    def __init__(
        self, args: argparse.Namespace, nodes: dict[int, Node], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.args = args
        self.nodes = nodes
        self.loop = loop
        self.stats = Stats()
        self.content_type = CONTENT_TYPES[args.encoding]
        self.token: str | None = getattr(args, "token", None) or None
        self.leader = Target(_addr(args.url), self.content_type, self.token)
        # The run's window on the loop's monotonic clock (start_at is wall time, shared
        # with the driver and the other generator processes).
        offset = loop.time() - time.time()
        self.start = args.start_at + offset
        self.end = args.start_at + args.duration + offset
        self.wall_start = args.start_at
        self.running = len(nodes)
        self.done: asyncio.Future[None] = loop.create_future()

    def launch(self) -> None:
        for node in self.nodes:
            Datanode(self, node).schedule_first()
        if self.running == 0 and not self.done.done():
            self.done.set_result(None)

    def finished(self) -> None:
        self.running -= 1
        if self.running == 0 and not self.done.done():
            self.done.set_result(None)

    def target(self, addr: tuple[str, int]) -> Target:
        if addr != self.leader.addr:
            self.leader = Target(addr, self.content_type, self.token)
        return self.leader


class Datanode:
    """One datanode's heartbeat loop: timer -> advance -> send -> answer -> timer."""

    def __init__(self, gen: Generator, node: int) -> None:
        self.gen = gen
        self.body = gen.nodes[node]
        self.target = gen.leader
        self.exchange = Exchange(self._answered, self._failed)
        self.connecting = False
        rng = np.random.default_rng(node)
        self.next_at = gen.start + float(rng.random()) * gen.args.interval
        self.t0 = 0.0
        self.sent_at = 0.0
        self.buffers: list[bytes | bytearray] = []
        self.timeout: asyncio.TimerHandle | None = None

    def schedule_first(self) -> None:
        self.gen.loop.call_at(self.next_at, self._fire)

    def _schedule(self) -> None:
        gen = self.gen
        now = gen.loop.time()
        interval = gen.args.interval
        if self.next_at <= now and now - self.next_at > interval:
            # A whole interval behind (a slow answer): skip, and say so.
            skipped = int((now - self.next_at) // interval)
            gen.stats.missed += skipped
            self.next_at += skipped * interval
        gen.loop.call_at(self.next_at, self._fire)

    def _fire(self) -> None:
        gen = self.gen
        if gen.loop.time() >= gen.end:
            if self.exchange.transport is not None:
                self.exchange.transport.close()
            gen.finished()
            return
        self.next_at += gen.args.interval
        self.buffers = self.body.advance()
        self.sent_at = time.time() - gen.wall_start
        self.t0 = time.monotonic()
        self.timeout = gen.loop.call_at(gen.loop.time() + REQUEST_TIMEOUT, self._timed_out)
        if self.exchange.open:
            self._send()
        elif self.connecting:
            self._failed("ConnectPending")  # the last connect has not finished: count, skip
        else:
            self.connecting = True
            gen.loop.create_task(self._connect())

    async def _connect(self) -> None:
        exchange = Exchange(self._answered, self._failed)
        try:
            await self.gen.loop.create_connection(lambda: exchange, *self.target.addr)
        except OSError:
            self.connecting = False
            self._failed("ConnectError")
            return
        self.connecting = False
        self.exchange = exchange
        if self.timeout is not None:  # else the request timed out while connecting
            self._send()

    def _send(self) -> None:
        length = sum(len(b) for b in self.buffers)
        self.exchange.send([self.target.head + b"%d\r\n\r\n" % length, *self.buffers])

    def _timed_out(self) -> None:
        self.timeout = None
        if self.exchange.busy:
            self.exchange.abort("Timeout")
        else:
            self._failed("Timeout")  # still connecting

    def _answered(self, status: int, body: bytes) -> None:
        gen = self.gen
        latency = time.monotonic() - self.t0
        if self.timeout is not None:
            self.timeout.cancel()
            self.timeout = None
        stats = gen.stats
        if status == 200:
            rejected = orjson.loads(body)["rejected"]
            stats.ok += 1
            stats.region_stats += gen.args.regions - len(rejected)
            for item in rejected:
                reason = str(item.get("reason"))
                stats.rejected_regions[reason] = stats.rejected_regions.get(reason, 0) + 1
            stats.times.append(self.sent_at)
            stats.latencies.append(latency)
        else:
            if status == 421:
                # As a datanode does: go to the leader the 421 names (if it names another
                # one; null or itself means an election is under way).
                named = orjson.loads(body)["error"].get("leader")
                if named and _addr(named) != self.target.addr:
                    self.target = gen.target(_addr(named))
                    if self.exchange.transport is not None:
                        self.exchange.transport.close()
                    stats.leader_switches += 1
            stats.error(f"http_{status}", self.sent_at)
        self._schedule()

    def _failed(self, reason: str) -> None:
        if self.timeout is not None:
            self.timeout.cancel()
        elif reason != "Timeout":
            return  # the request already counted as timed out
        self.timeout = None
        self.gen.stats.error(reason, self.sent_at)
        self._schedule()


class Follower:
    """Heartbeats to the follower at `--follower-rate`/s; each answer counted (a 421 that
    names the leader is `421_names_leader`)."""

    def __init__(self, gen: Generator, url: str, body: Node) -> None:
        self.gen = gen
        self.body = body
        self.target = Target(_addr(url), gen.content_type, gen.token)
        self.exchange = Exchange(self._answered, self._failed)
        self.pause = 1.0 / gen.args.follower_rate

    def _count(self, key: str) -> None:
        counts = self.gen.stats.follower
        counts[key] = counts.get(key, 0) + 1

    def start(self) -> None:
        self.gen.loop.call_at(self.gen.start, self._fire)

    def _fire(self) -> None:
        if self.gen.loop.time() >= self.gen.end:
            if self.exchange.transport is not None:
                self.exchange.transport.close()
            return
        self.gen.loop.create_task(self._send())

    async def _send(self) -> None:
        if not self.exchange.open:
            self.exchange = Exchange(self._answered, self._failed)
            try:
                await self.gen.loop.create_connection(lambda: self.exchange, *self.target.addr)
            except OSError:
                self._failed("ConnectError")
                return
        buffers = self.body.buffers()
        length = sum(len(b) for b in buffers)
        self.exchange.send([self.target.head + b"%d\r\n\r\n" % length, *buffers])

    def _answered(self, status: int, body: bytes) -> None:
        key = f"http_{status}"
        if status == 421:
            named = orjson.loads(body)["error"].get("leader")
            key = "421_names_leader" if named == self.gen.args.leader_addr else "421_other_leader"
        self._count(key)
        self.gen.loop.call_later(self.pause, self._fire)

    def _failed(self, reason: str) -> None:
        self._count(reason)
        self.gen.loop.call_later(self.pause, self._fire)


def cpu_seconds() -> float:
    """User + system CPU of this process (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(args: argparse.Namespace) -> None:
    from metasrv.kafka import KafkaAdmin

    loop = asyncio.get_running_loop()
    first, last = (int(x) for x in args.node_range.split(":"))
    topics = Topics([f"{args.prefix}_wal_{n}" for n in range(args.topics)], args.encoding)
    admin = KafkaAdmin(args.kafka)

    async def refresh() -> None:
        # Kafka is asked on a worker thread; the ids change on the loop, between heartbeats.
        offsets = await asyncio.to_thread(admin.offsets, topics.names)
        topics.update({t: o.high_watermark for t, o in offsets.items()})

    await refresh()
    rng = np.random.default_rng(first)
    draws = Draws(rng)
    nodes = {node: Node(node, args, topics, rng, draws) for node in range(first, last)}
    gen = Generator(args, nodes, loop)
    # The bodies live for the whole run: out of the collector's reach, so this process's
    # own GC passes do not show up as server latency.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()

    async def refresher() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a missed read keeps the last ids
                await refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HW_REFRESH)

    cpu0 = cpu_seconds()
    hw = asyncio.create_task(refresher())
    gen.launch()
    if args.follower_url and args.follower_rate > 0 and nodes:
        Follower(gen, args.follower_url, nodes[first]).start()
    await gen.done
    stop.set()
    await hw
    cpu = cpu_seconds() - cpu0
    admin.close()
    stats = gen.stats
    out = Path(args.out_file)
    with out.with_suffix(".lat").open("wb") as fh:
        stats.times.tofile(fh)
        stats.latencies.tofile(fh)
    out.write_text(
        json.dumps(
            {
                "ok": stats.ok,
                "count": len(stats.latencies),
                "errors": stats.errors,
                "rejected_regions": stats.rejected_regions,
                "region_stats": stats.region_stats,
                "missed": stats.missed,
                "follower": stats.follower,
                "error_times": [round(t, 2) for t in stats.error_times[:2000]],
                "leader_switches": stats.leader_switches,
                "cpu_seconds": cpu,
                "generator": "raw",
            }
        )
    )


def run(args: argparse.Namespace) -> None:
    """One generator process (load.py `--client`); uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(_run(args))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_run(args))
