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
- **Stats move forward as `--change` asks.** A body lists a datanode's busy regions first,
  then its idle ones (every 4th region), so a heartbeat moves contiguous slices: each
  heartbeat walks on through both runs, `max(1, round(change x regions))` regions split
  between them in proportion, so every region moves about once every 1/change
  heartbeats. A busy region's `flushed_entry_id` goes to max(itself, its topic's latest
  id - a random lag of 0-50), its `memtable_bytes` to a random 1 KiB - 4 MiB and its
  `manifest_version` up by one; an idle region's `topic_latest_entry_id` goes to
  max(itself, its topic's latest id). Nothing goes backwards. The topics' latest ids are
  their Kafka high watermarks, read every 5 s on a thread, as in the httpx generator; the
  targets (latest id - lag) are computed once per read, and the random values come from
  pools drawn once per process.
- **Raw connections.** One keep-alive HTTP/1.1 connection per datanode, a non-blocking
  socket opened on first use and again after the server closed it. A request is one
  `sendmsg` of the request head and the body's buffers (with `authorization: Bearer` when
  a token is given); the answer is parsed by its status line and `content-length` only,
  and a 200's JSON is read for its `rejected` list (not at all when it ends in
  `"rejected":[]}`). A request unanswered after 30 s counts as `Timeout` and its
  connection is closed. The loop and the connections are `_raw_http.py`.
- **Datanodes that follow the leader.** Each datanode knows every metasrv address
  (`--url`, then `--urls`) and routes by the product datanode client's `Route` (`_failover.py`): a
  421's named leader (`{"error": {"code": "not_leader", "leader": "host:port" | null}}`,
  api/errors.py) at once; past a refused, reset or timed-out connection to the next
  address; after a 503, or an attempt that found no leader, a retry after the product's
  backoff (`metasrv.datanode.Backoff`; `--cap-jitter` sets its spread at the cap). After
  a 200 it sends on its schedule again; after the 200 that ends failed attempts, on a
  phase drawn afresh (`_failover.py`).
- **One thread that wakes once per heartbeat.** An epoll loop sleeps until the next
  heartbeat is due (at most 50 ms), then reads every socket with data and sends what is
  due, at its due time: answers never wake it, so at the design load it wakes about once
  per heartbeat where an asyncio loop wakes twice (a wake-up costs this process tens of
  microseconds of CPU on a shared 2-core VM). Each datanode sends every `--interval` s
  from a random phase; one whose answer came more than a whole interval late skips the
  intervals it missed and counts them (`missed`), as the httpx generator does.
- **Measured cheaply.** Latency runs from `time.time()` just before the request is handed
  to the socket (the connect included when the connection had to be opened) to the
  arrival of the answer's last segment as the kernel stamped it (`SO_TIMESTAMPNS`, the
  real-time clock; the read time where no stamp came), so the time an answer waits to be
  read is not counted; each 200's send time, latency and datanode go to `array`s (the
  `.lat` file: times, latencies, datanodes). The schedule and the timeouts run
  on `time.monotonic()`. The generator's CPU is `getrusage(RUSAGE_SELF)` user + system
  (every thread: the high-watermark reader's and the Kafka client's included) from after
  the bodies are built to the end of the run, as `cpu_seconds` (with its user and system
  parts).

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
import contextlib
import gc
import json
import random
import resource
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import orjson
from _failover import Failover
from _raw_http import Loop, Wire, addr_of, framed, request_head

from metasrv.model import NULL
from metasrv.wire import encode_columns

NODE_BASE = 10_000
"""Synthetic datanode ids start here (as in load.py)."""
IDLE_EVERY = 4
"""Every 4th synthetic region is idle."""
HW_REFRESH = 5.0
"""Seconds between reads of the topics' high watermarks."""
REQUEST_TIMEOUT = 30.0
"""Seconds a request may take before it counts as `Timeout` and its connection is closed
(checked once a second)."""
MAX_LAG = 50
"""A busy region's flushed id trails its topic's latest id by 0..MAX_LAG."""
CONTENT_TYPES = {"json": b"application/json", "columns": b"application/msgpack"}
NONE_REJECTED = b'"rejected":[]}'
"""How the leader's answer ends when it rejected no region (metasrv/leader/_heartbeat.py)."""


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

    def __init__(self, rng: np.random.Generator, regions: int) -> None:
        self.size = max(1 << 16, 4 * regions)
        self.lag = rng.integers(0, MAX_LAG, self.size, endpoint=True)
        self.memtable = rng.integers(1024, 4 << 20, self.size, endpoint=True)
        self._at = 0

    def take(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`k` lags and `k` memtable sizes (k <= a node's regions)."""
        at = self._at
        if at + k > self.size:
            at = 0
        self._at = at + k
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
    """One datanode's regions, their stats, and its heartbeat body kept encoded.

    The body lists the busy regions first, then the idle ones (each in region order), so
    the regions a heartbeat moves are contiguous slices of the columns: numpy updates them
    in place through views, without gathering by index."""

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
        idle = index % IDLE_EVERY == 0
        order = np.concatenate([index[~idle], index[idle]])  # region index at each position
        self.busy = int((~idle).sum())
        #: Each position's topic, as an index into `topics.names` (load.py's `topic_of`).
        self.topic = (node * n + order) % len(topics.names)
        self.used = tuple(sorted(set(self.topic.tolist())))
        count = max(1, round(n * args.change))
        idle_count = n - self.busy
        take_busy = min(self.busy, round(count * self.busy / n))
        take_idle = min(idle_count, count - take_busy)
        # [first position, size, moved per heartbeat, cursor] of the busy and the idle run.
        self._runs = [[0, self.busy, take_busy, 0], [self.busy, idle_count, take_idle, 0]]
        # Every region observed once, after the first high-watermark read (load.py's prime).
        latest = topics.latest[self.topic]
        is_idle = np.arange(n) >= self.busy
        lag = rng.integers(0, MAX_LAG, n, endpoint=True)
        flushed = np.where(is_idle, -1, np.maximum(-1, latest - lag))
        memtable = np.where(is_idle, 0, rng.integers(1024, 4 << 20, n, endpoint=True))
        topic_latest = np.where(is_idle, np.maximum(-1, latest), NULL)
        manifest = np.where(is_idle, 1, 2)
        ids = [region_id(node, i) for i in order.tolist()]
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
                + (b'"topic_latest_entry_id":%d,' if quiet else b'"topic_latest_entry_id":null,')
                + b'"memtable_bytes":%d,"manifest_version":%d}'
                for rid, name, quiet in zip(ids, names, is_idle.tolist(), strict=True)
            ]
            self._fragments = [b""] * n
            self._render(0, n)
            self._head = b'{"node_id":%d,"addr":%b,"regions":[' % (
                self.node_id,
                orjson.dumps(addr),
            )
        self.aim()

    def _render(self, lo: int, hi: int) -> None:
        """Re-render the JSON fragments of positions lo..hi-1."""
        rows = zip(
            range(lo, hi),
            self.flushed[lo:hi].tolist(),
            self.latest[lo:hi].tolist(),
            self.memtable[lo:hi].tolist(),
            self.manifest[lo:hi].tolist(),
            strict=True,
        )
        templates, fragments, busy = self._templates, self._fragments, self.busy
        for i, flushed, latest, memtable, manifest in rows:
            values = (
                (flushed, memtable, manifest) if i < busy else (flushed, latest, memtable, manifest)
            )
            fragments[i] = templates[i] % values

    def _spans(self, run: list[int]) -> list[tuple[int, int]]:
        """The next positions of a run to move, as 1 or 2 slices (the walk wraps)."""
        first, size, take, cursor = run
        if not take:
            return []
        run[3] = (cursor + take) % size
        if cursor + take <= size:
            return [(first + cursor, first + cursor + take)]
        return [(first + cursor, first + size), (first, first + cursor + take - size)]

    def aim(self) -> None:
        """Where the regions moved until the next high-watermark read go: a busy region's
        flushed id to its topic's latest id minus a lag, an idle region's latest id to its
        topic's (computed once per read, not per heartbeat)."""
        target = self.topics.latest[self.topic]
        lag, _ = self.draws.take(self.busy)
        target[: self.busy] -= lag
        self._target = target

    def advance(self) -> list[bytes | bytearray]:
        """Move the next regions of each run forward; the next heartbeat's buffers."""
        target, json = self._target, self.encoding == "json"
        busy, idle = self._runs
        for lo, hi in self._spans(busy):
            flushed = self.flushed[lo:hi]
            np.maximum(flushed, target[lo:hi], out=flushed)
            self.memtable[lo:hi] = self.draws.take(hi - lo)[1]
            manifest = self.manifest[lo:hi]
            manifest += 1
            if json:
                self._render(lo, hi)
        for lo, hi in self._spans(idle):
            seen = self.latest[lo:hi]
            np.maximum(seen, target[lo:hi], out=seen)
            if json:
                self._render(lo, hi)
        return self.buffers()

    def buffers(self) -> list[bytes | bytearray]:
        """The heartbeat as it stands."""
        reports = self.topics.reports(self.used)
        if self.encoding == "columns":
            return [self.body, reports]
        return [self._head, b",".join(self._fragments), b'],"topics":', reports, b"}"]


# --- the run --------------------------------------------------------------------------------


class Stats:
    """What one generator process saw, raw or httpx (load.py's client JSON and `.lat`)."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.rejected_regions: dict[str, int] = {}
        self.region_stats = 0
        self.missed = 0
        self.follower: dict[str, int] = {}
        self.times: array.array[float] = array.array("d")
        self.latencies: array.array[float] = array.array("d")
        self.nodes: array.array[int] = array.array("i")  # each 200's datanode
        self.error_times: list[float] = []
        self.leader_switches = 0
        """Moves to another metasrv address (a 421's leader, or away from a failure)."""

    def error(self, key: str, at: float | None = None) -> None:
        """Count a failed heartbeat (`at`: its send time, kept for the error timeline)."""
        self.errors[key] = self.errors.get(key, 0) + 1
        if at is not None:
            self.error_times.append(at)

    def write(self, out_file: str, generator: str, cpu: dict[str, float]) -> None:
        """The counters to `out_file` (JSON) and each 200's send time, latency and datanode
        to its `.lat` sibling (three arrays one after the other)."""
        out = Path(out_file)
        with out.with_suffix(".lat").open("wb") as fh:
            self.times.tofile(fh)
            self.latencies.tofile(fh)
            self.nodes.tofile(fh)
        counts = {
            "ok": self.ok,
            "count": len(self.latencies),
            "errors": self.errors,
            "rejected_regions": self.rejected_regions,
            "region_stats": self.region_stats,
            "missed": self.missed,
            "follower": self.follower,
            "error_times": [round(t, 2) for t in self.error_times[:2000]],
            "leader_switches": self.leader_switches,
        }
        out.write_text(json.dumps({**counts, **cpu, "generator": generator}))


class Generator:
    """Every datanode of this process on one `Loop`."""

    def __init__(self, args: argparse.Namespace, nodes: dict[int, Node], topics: Topics) -> None:
        self.args = args
        self.nodes = nodes
        self.topics = topics
        self.loop = Loop()
        self.stats = Stats()
        self.content_type = CONTENT_TYPES[args.encoding]
        self.token: str | None = getattr(args, "token", None) or None
        self.leader = addr_of(args.url)
        self.heads = {self.leader: request_head(self.leader, self.content_type, self.token)}
        # Every metasrv address a datanode knows: the first leader, then the others.
        others = [addr_of(u) for u in (getattr(args, "urls", None) or "").split(",") if u]
        self.addrs = [self.leader, *others]
        # The run's window on the monotonic clock (start_at is wall time, shared with the
        # driver and the other generator processes).
        offset = time.monotonic() - time.time()
        self.wall_start = args.start_at
        self.start = args.start_at + offset
        self.end = args.start_at + args.duration + offset
        self.running = len(nodes)
        self.datanodes = [Datanode(self, node) for node in nodes]
        self.fresh: dict[str, int] | None = None  # high watermarks from the reader thread
        self._sweep_at = self.start

    def head(self, addr: tuple[str, int]) -> bytes:
        head = self.heads.get(addr)
        if head is None:
            head = self.heads[addr] = request_head(addr, self.content_type, self.token)
        return head

    def run(self) -> None:
        for datanode in self.datanodes:
            self.loop.call_at(datanode.next_at, datanode.fire)
        self.loop.run(lambda: self.running == 0, self._each_wake)

    def _each_wake(self) -> None:
        fresh = self.fresh
        if fresh is not None:
            self.fresh = None
            self.topics.update(fresh)
            for node in self.nodes.values():
                node.aim()
        now = time.monotonic()
        if now >= self._sweep_at:
            # Requests older than REQUEST_TIMEOUT: one check a second for every datanode.
            self._sweep_at = now + 1.0
            oldest = now - REQUEST_TIMEOUT
            for datanode in self.datanodes:
                if datanode.inflight and datanode.t0 < oldest:
                    datanode.timed_out()


class Datanode:
    """One datanode's heartbeat loop: timer -> advance -> send -> answer -> timer."""

    def __init__(self, gen: Generator, node: int) -> None:
        self.gen = gen
        self.node = node
        self.body = gen.nodes[node]
        self.route = Failover(
            gen.addrs, gen.args.interval, random.Random(node), gen.args.cap_jitter
        )
        self.wire = Wire(gen.loop, self.route.current, self._answered, self._failed)
        rng = np.random.default_rng(node)
        self.next_at = gen.start + float(rng.random()) * gen.args.interval
        self.t0 = 0.0
        self.sent_wall = 0.0
        self.inflight = False

    def _schedule(self) -> None:
        gen = self.gen
        now = time.monotonic()
        interval = gen.args.interval
        if self.next_at <= now and now - self.next_at > interval:
            # A whole interval behind (a slow answer): skip, and say so.
            skipped = int((now - self.next_at) // interval)
            gen.stats.missed += skipped
            self.next_at += skipped * interval
        gen.loop.call_at(self.next_at, self.fire)

    def fire(self) -> None:
        gen = self.gen
        if time.monotonic() >= gen.end:
            self.wire.close()
            gen.running -= 1
            return
        self.next_at += gen.args.interval
        buffers = framed(gen.head(self.route.current), self.body.advance())
        self.inflight = True
        self.t0 = time.monotonic()
        self.sent_wall = time.time()
        self.wire.request(buffers)

    def timed_out(self) -> None:
        """The request in flight took too long: its connection is closed, it is counted."""
        self.wire.close()
        self._failed("Timeout")

    def _answered(self, status: int, body: bytes, arrived: float) -> None:
        if not self.inflight:
            return
        self.inflight = False
        gen = self.gen
        stats = gen.stats
        sent_at = self.sent_wall - gen.wall_start
        if status == 200:
            rejected = [] if body.endswith(NONE_REJECTED) else orjson.loads(body)["rejected"]
            stats.ok += 1
            stats.region_stats += gen.args.regions - len(rejected)
            for item in rejected:
                reason = str(item.get("reason"))
                stats.rejected_regions[reason] = stats.rejected_regions.get(reason, 0) + 1
            stats.times.append(sent_at)
            stats.latencies.append(max(0.0, arrived - self.sent_wall))
            stats.nodes.append(self.node)
            new_phase = self.route.served()
            if new_phase is not None:
                self.next_at = time.monotonic() + new_phase
            self._schedule()
            return
        stats.error(f"http_{status}", sent_at)
        if status == 421:
            # As a datanode does (`_failover.py`): to the leader the 421 names, at once.
            named = orjson.loads(body)["error"].get("leader")
            self._retry(self.route.not_leader(named))
        else:
            self._retry(self.route.loading())

    def _failed(self, reason: str) -> None:
        if not self.inflight:
            return
        self.inflight = False
        self.gen.stats.error(reason, self.sent_wall - self.gen.wall_start)
        self._retry(self.route.unreachable())

    def _retry(self, delay: float) -> None:
        """Send again after `delay` seconds (0: at once), to the route's current address."""
        gen = self.gen
        if self.route.current != self.wire.addr:
            self.wire.close()
            self.wire = Wire(gen.loop, self.route.current, self._answered, self._failed)
            gen.stats.leader_switches += 1
        self.next_at = time.monotonic() + delay
        gen.loop.call_at(self.next_at, self.fire)


class Follower:
    """Heartbeats to the follower at `--follower-rate`/s; each answer counted (a 421 that
    names the leader is `421_names_leader`)."""

    def __init__(self, gen: Generator, url: str, body: Node) -> None:
        self.gen = gen
        self.body = body
        addr = addr_of(url)
        self.head = gen.head(addr)
        self.wire = Wire(gen.loop, addr, self._answered, self._failed)
        self.pause = 1.0 / gen.args.follower_rate

    def start(self) -> None:
        self.gen.loop.call_at(self.gen.start, self._fire)

    def _fire(self) -> None:
        if time.monotonic() >= self.gen.end:
            self.wire.close()
            return
        self.wire.request(framed(self.head, self.body.buffers()))

    def _count(self, key: str) -> None:
        counts = self.gen.stats.follower
        counts[key] = counts.get(key, 0) + 1
        self.gen.loop.call_at(time.monotonic() + self.pause, self._fire)

    def _answered(self, status: int, body: bytes, arrived: float) -> None:
        key = f"http_{status}"
        if status == 421:
            named = orjson.loads(body)["error"].get("leader")
            key = "421_names_leader" if named == self.gen.args.leader_addr else "421_other_leader"
        self._count(key)

    def _failed(self, reason: str) -> None:
        self._count(reason)


def cpu_seconds() -> tuple[float, float]:
    """User and system CPU seconds of this process (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def run(args: argparse.Namespace) -> None:
    """One generator process (load.py `--client`): writes `args.out_file` (+ `.lat`)."""
    from metasrv.kafka import KafkaAdmin

    first, last = (int(x) for x in args.node_range.split(":"))
    topics = Topics([f"{args.prefix}_wal_{n}" for n in range(args.topics)], args.encoding)
    admin = KafkaAdmin(args.kafka)

    def read() -> dict[str, int]:
        return {t: o.high_watermark for t, o in admin.offsets(topics.names).items()}

    topics.update(read())
    rng = np.random.default_rng(first)
    draws = Draws(rng, args.regions)
    nodes = {node: Node(node, args, topics, rng, draws) for node in range(first, last)}
    gen = Generator(args, nodes, topics)
    if args.follower_url and args.follower_rate > 0 and nodes:
        Follower(gen, args.follower_url, nodes[first]).start()
    stop = threading.Event()

    def reader() -> None:
        # Kafka is asked on this thread; the loop applies the ids between heartbeats.
        while not stop.wait(HW_REFRESH):
            with contextlib.suppress(Exception):  # a missed read keeps the last ids
                gen.fresh = read()

    thread = threading.Thread(target=reader, name="high-watermarks", daemon=True)
    # The bodies live for the whole run: out of the collector's reach, so this process's
    # own GC passes do not show up as server latency.
    gc.collect()
    gc.freeze()
    cpu0 = cpu_seconds()
    thread.start()
    gen.run()
    user, system = (b - a for a, b in zip(cpu0, cpu_seconds(), strict=True))
    stop.set()
    thread.join()
    admin.close()
    cpu = {"cpu_seconds": user + system, "cpu_user_seconds": user, "cpu_system_seconds": system}
    gen.stats.write(args.out_file, "raw", cpu)
