"""Raw keep-alive HTTP/1.1 for the load generator (`_load_gen.py`): an epoll loop and its
connections, with the answers' arrival taken from the kernel's receive stamps.

`Loop` runs timers and non-blocking sockets in one thread and wakes only for the next timer
or after `MAX_SLEEP`; `Wire` is one connection carrying one request at a time, its answer
parsed by status line and `content-length` only. `request_head` and `framed` build a
heartbeat request as buffers for one `sendmsg`; `addr_of` turns a URL or `host:port` into a
socket address. Benchmark code only: the product's datanode client is `metasrv.datanode`.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from urllib.parse import urlsplit

SO_TIMESTAMPNS = 35
"""Linux `SO_TIMESTAMPNS` (also the cmsg type; Python's socket module lacks it): the kernel
stamps what a socket receives with the real-time clock at its arrival."""
_TIMESPEC = struct.Struct("qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
MAX_SLEEP = 0.05
"""Longest the loop sleeps: answers wait at most this long to be read (their arrival time
comes from the kernel, so the wait is not in the latency)."""


class Loop:
    """Timers and non-blocking sockets in one thread. It wakes only for the next timer (a
    heartbeat due) or after `MAX_SLEEP`, then reads every socket that has data: answers
    never wake it on their own, so at the design load it wakes about once per heartbeat
    sent rather than twice."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.wires: dict[int, Wire] = {}
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.connecting = 0

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """`callback()` at `when` (time.monotonic)."""
        heapq.heappush(self.timers, (when, next(self._seq), callback))

    def watch(self, sock: socket.socket, wire: Wire, write: bool) -> None:
        self.epoll.register(sock.fileno(), select.EPOLLIN | (select.EPOLLOUT if write else 0))
        self.wires[sock.fileno()] = wire

    def rewatch(self, sock: socket.socket, write: bool) -> None:
        self.epoll.modify(sock.fileno(), select.EPOLLIN | (select.EPOLLOUT if write else 0))

    def forget(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.epoll.unregister(sock.fileno())
        self.wires.pop(sock.fileno(), None)

    def run(self, done: Callable[[], bool], each_wake: Callable[[], None]) -> None:
        timers, poll, wires = self.timers, self.epoll.poll, self.wires
        while not done():
            wait = MAX_SLEEP
            if timers:
                wait = min(wait, timers[0][0] - time.monotonic())
            if self.connecting:
                wait = min(wait, 0.001)
            if wait > 0:
                time.sleep(wait)
            for fd, mask in poll(0):
                wire = wires.get(fd)
                if wire is not None:
                    wire.on_event(mask)
            each_wake()
            now = time.monotonic()
            while timers and timers[0][0] <= now:
                heapq.heappop(timers)[2]()


class Wire:
    """One keep-alive HTTP/1.1 connection carrying one request at a time, opened on first
    use and again after it closed. The answer is parsed by its status line and
    `content-length` only, and handed to `answered` with its arrival time as the kernel
    stamped it (`SO_TIMESTAMPNS`, real-time clock; the time it was read if not stamped)."""

    def __init__(
        self,
        loop: Loop,
        addr: tuple[str, int],
        answered: Callable[[int, bytes, float], None],
        failed: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.addr = addr
        self._answered = answered
        self._failed = failed
        self.sock: socket.socket | None = None
        self.connected = False
        self.busy = False
        self._writing = False
        self._out: list[memoryview] = []
        self._buf = bytearray()
        self._end = -1  # where the answer ends in _buf; -1: head not read yet
        self._body_at = 0
        self._status = 0
        self._close_after = False
        self._arrived = 0.0

    def request(self, buffers: list[bytes | bytearray]) -> None:
        """Send one request; its answer or failure comes through the callbacks."""
        self.busy = True
        self._arrived = 0.0
        self._out = [memoryview(b) for b in buffers]
        if self.sock is None:
            try:
                self._connect()
            except OSError:
                self.busy = False
                self._out = []
                self._failed("ConnectError")
                return
        if self.connected:
            self._flush()

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        err = sock.connect_ex(self.addr)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(err, os.strerror(err))
        self.sock = sock
        self.connected = err == 0
        self._writing = not self.connected
        if not self.connected:
            self.loop.connecting += 1
        self.loop.watch(sock, self, self._writing)

    def close(self) -> None:
        """Close the connection; a request in flight is dropped without a callback."""
        if self.sock is None:
            return
        if not self.connected:
            self.loop.connecting -= 1
        self.loop.forget(self.sock)
        self.sock.close()
        self.sock = None
        self.connected = False
        self.busy = False
        self._out = []
        self._buf.clear()
        self._end = -1

    def _lost(self, reason: str) -> None:
        busy = self.busy
        self.close()
        if busy:
            self._failed(reason)

    def on_event(self, mask: int) -> None:
        if self.sock is None:
            return
        if not self.connected and mask & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
            self.loop.connecting -= 1
            self.connected = True  # counted down: close() must not count it again
            if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._lost("ConnectError")
                return
        if mask & select.EPOLLOUT:
            self._flush()
        if mask & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP):
            self._read()

    def _flush(self) -> None:
        assert self.sock is not None
        out = self._out
        try:
            sent = self.sock.sendmsg(out) if out else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self._lost("ConnectionLost")
            return
        while sent and out:
            size = out[0].nbytes
            if sent >= size:
                sent -= size
                out.pop(0)
            else:
                out[0] = out[0][sent:]
                sent = 0
        writing = bool(out)
        if writing != self._writing:
            self._writing = writing
            self.loop.rewatch(self.sock, writing)

    def _read(self) -> None:
        while self.sock is not None:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(1 << 16, _ANCILLARY)
            except BlockingIOError:
                return
            except OSError:
                self._lost("ConnectionLost")
                return
            if not data:
                self._lost("ConnectionLost")
                return
            for level, kind, raw in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanos = _TIMESPEC.unpack(raw)
                    self._arrived = seconds + nanos * 1e-9
            self._buf += data
            if self._parse():
                return  # one answer per request: no read that would only find nothing

    def _parse(self) -> bool:
        """True when the answer is complete (and handed over)."""
        buf = self._buf
        if self._end < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return False
            head = bytes(buf[:head_end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if not head.startswith(b"http/1.1 ") or at < 0:
                self._lost("BadResponse")
                return True
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else head_end])
            self._status = int(head[9:12])
            self._close_after = b"\r\nconnection: close" in head
            self._body_at = head_end + 4
            self._end = self._body_at + length
        if len(buf) < self._end:
            return False
        body = bytes(buf[self._body_at : self._end])
        del buf[: self._end]
        self._end = -1
        self.busy = False
        arrived = self._arrived or time.time()
        if self._close_after:
            self.close()
        self._answered(self._status, body, arrived)
        return True


def addr_of(url_or_addr: str) -> tuple[str, int]:
    parts = urlsplit(url_or_addr if "//" in url_or_addr else f"http://{url_or_addr}")
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def request_head(addr: tuple[str, int], content_type: bytes, token: str | None) -> bytes:
    """The fixed part of a heartbeat request's head, up to the content length's value."""
    auth = b"authorization: Bearer %b\r\n" % token.encode() if token else b""
    return (
        b"POST /v1/heartbeat HTTP/1.1\r\nhost: %b:%d\r\ncontent-type: %b\r\n%bcontent-length: "
    ) % (addr[0].encode(), addr[1], content_type, auth)


def framed(head: bytes, buffers: list[bytes | bytearray]) -> list[bytes | bytearray]:
    return [head + b"%d\r\n\r\n" % sum(len(b) for b in buffers), *buffers]
