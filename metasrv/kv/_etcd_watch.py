"""`KvWatch` on etcd: one gRPC watch stream on one member (see `_protocol.py`).

The stream is read on the caller's thread through a small queue fed by gRPC's response
iterator on a daemon thread, so `next` can give up after its timeout. `sync` sends a
progress request: etcd answers it (an event-less response carrying its current revision)
only once every event up to that revision was sent on the stream, and only while the
watcher is in step, so the request is repeated until the answer comes or `sync`'s
timeout ends (then `WatchLost`: the follower reloads in full).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyetcd import etcdrpc
from pyetcd.etcdrpc import kv_pb2

from metasrv.kv._common import prefix_range_end
from metasrv.kv._etcd_members import EtcdMembers
from metasrv.kv._etcd_security import EtcdSecurity
from metasrv.kv._protocol import KvChange, WatchLost

_PROGRESS_RETRY = 0.5
"""Seconds between two progress requests while `sync` waits for an answer."""

_DONE = object()
_WAKE = object()
"""Put among the responses by `wake`: the read waiting for one returns without."""


class EtcdWatch:
    """Changes under `key_prefix + prefix` after `after_revision`, from one member of the
    cluster at `endpoints` (reached as the kv reaches them: `timeout`, `security`)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        timeout: float,
        security: EtcdSecurity,
        key_prefix: str,
        prefix: str,
        after_revision: int,
    ) -> None:
        self._cut = len(key_prefix.encode())
        self._members = EtcdMembers(endpoints, timeout, security, name="watch")
        member = self._members.pick().member
        channel = self._members.client.endpoints[member].channel
        self._requests: queue.Queue[Any] = queue.Queue()
        self._responses: queue.Queue[Any] = queue.Queue()
        self._pending: list[KvChange] = []
        self._closed = False
        lo = key_prefix.encode() + prefix.encode()
        self._requests.put(
            etcdrpc.WatchRequest(
                create_request=etcdrpc.WatchCreateRequest(
                    key=lo, range_end=prefix_range_end(lo), start_revision=after_revision + 1
                )
            )
        )
        self._stream = etcdrpc.WatchStub(channel).Watch(self._request_iter())
        self._reader = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self._reader.start()

    def next(self, timeout: float) -> list[KvChange]:
        deadline = time.monotonic() + timeout
        changes, self._pending = self._pending, []
        while not changes:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            response = self._get(left)
            if response is None:
                return []
            changes.extend(self._events(response))
        # Whatever else already arrived comes along without waiting.
        while True:
            response = self._get(0)
            if response is None:
                return changes
            changes.extend(self._events(response))

    def sync(self, timeout: float) -> tuple[list[KvChange], int]:
        deadline = time.monotonic() + timeout
        changes, self._pending = self._pending, []
        while time.monotonic() < deadline:
            self._requests.put(
                etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest())
            )
            answer_by = min(deadline, time.monotonic() + _PROGRESS_RETRY)
            while (left := answer_by - time.monotonic()) > 0:
                response = self._get(left)
                if response is None:
                    break
                events = self._events(response)
                if events:
                    changes.extend(events)
                elif not response.created:
                    return changes, int(response.header.revision)
        raise WatchLost(f"etcd sent no progress notification within {timeout:.1f}s")

    def wake(self) -> None:
        self._responses.put(_WAKE)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._requests.put(_DONE)
        self._stream.cancel()
        self._members.close()

    # --- internals -------------------------------------------------------------------

    def _request_iter(self) -> Iterator[Any]:
        while True:
            request = self._requests.get()
            if request is _DONE:
                return
            yield request

    def _read(self) -> None:
        try:
            for response in self._stream:
                self._responses.put(response)
        except Exception as exc:  # the stream ended: cancelled, member gone, compacted
            self._responses.put(exc)
        else:
            self._responses.put(WatchLost("etcd ended the watch stream"))

    def _get(self, timeout: float) -> Any:
        try:
            item = (
                self._responses.get(timeout=timeout)
                if timeout > 0
                else self._responses.get_nowait()
            )
        except queue.Empty:
            return None
        if item is _WAKE:
            return None
        if isinstance(item, BaseException):
            self._responses.put(item)  # every later call fails the same way
            if isinstance(item, WatchLost):
                raise item
            raise WatchLost(f"etcd watch broke: {item}") from item
        return item

    def _events(self, response: Any) -> list[KvChange]:
        if response.canceled or response.compact_revision:
            raise WatchLost(
                f"etcd cancelled the watch (compacted to {response.compact_revision}): "
                f"{response.cancel_reason or 'no reason given'}"
            )
        cut = self._cut
        out = []
        for event in response.events:
            kv = event.kv
            deleted = event.type == kv_pb2.Event.DELETE
            out.append(
                KvChange(
                    kv.key[cut:].decode(errors="replace"),
                    None if deleted else bytes(kv.value),
                    int(kv.mod_revision),
                )
            )
        return out
