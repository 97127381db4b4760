"""A datanode's connection to a metasrv cluster: heartbeats and replay starts, sent to
whichever metasrv leads (the rules are `_route.py`'s).

`heartbeat` makes one attempt (every address at most once, 421s followed at once) and
raises when it fails: the heartbeat loop retries with a fresh report after a backoff.
`replay_start` retries on its own, with the same backoff, until its deadline: a region
cannot open without it. Given the region's own flushed entry id, it answers where to read
from by `replay_from`: never below the region's first unflushed entry.

Errors are the `metasrv.errors` classes the server named (`NotFound`, `Unauthenticated`,
...); a cluster that did not serve is `NotLeader` (every address a follower) or
`Unavailable` (unreachable, or a leader loading).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final, TypeVar

import httpx

from metasrv import wire
from metasrv.datanode._body import Body, Encoding, encode_heartbeat
from metasrv.datanode._route import Attempt, Route
from metasrv.errors import InvalidArgument, MetasrvError, NotLeader, Unavailable
from metasrv.process import Backoff

HEARTBEAT_PATH: Final = "/v1/heartbeat"
REPLAY_START_PATH: Final = "/v1/regions/{region_id}/replay-start"
T = TypeVar("T")


def replay_from(start_entry_id: int, flushed_entry_id: int | None) -> int:
    """Where a region reads its WAL from: metasrv's `start_entry_id`, or the region's own
    `flushed_entry_id + 1` when that is higher.

    metasrv answers from the last stat it holds, which can lag the region's manifest (the
    report of its last flush was lost in the crash, or went to the previous leader). Its
    next report then lets a purge delete below its true flushed id, so a consumer started
    at the lower answer meets a log start above it and fails (`auto.offset.reset=error`),
    although the region needs nothing below `flushed_entry_id + 1`: its SSTs hold it.
    """
    if flushed_entry_id is None:
        return start_entry_id
    return max(start_entry_id, flushed_entry_id + 1)


def _answer(response: httpx.Response, kind: type[T]) -> T:
    """A served answer decoded as `kind` (unknown fields ignored)."""
    try:
        return wire.decode(response.content, kind)
    except InvalidArgument as exc:
        raise MetasrvError(f"unexpected answer from {response.request.url}: {exc}") from exc


def _judge(attempt: Attempt, url: str, response: httpx.Response) -> MetasrvError | None:
    """None when `url` served; the error a routing answer (421, 503) stands for, the
    attempt told of it; any other error answer is raised."""
    if response.is_success:
        attempt.served(url)
        return None
    err = wire.error_from_response(response)
    if isinstance(err, NotLeader):
        attempt.not_leader(url, err.leader)
        return err
    if response.status_code == 503:
        attempt.loading(url)
        if isinstance(err, Unavailable):
            return err
        return Unavailable(err.message, details=err.details)
    attempt.served(url)
    raise err


def _unreachable(attempt: Attempt, url: str, exc: httpx.TransportError) -> Unavailable:
    attempt.unreachable(url)
    return Unavailable(f"metasrv at {url} is unreachable: {exc!r}")


def _addresses(addrs: str | Sequence[str]) -> list[str]:
    return [addrs] if isinstance(addrs, str) else list(addrs)


class _Common:
    def __init__(
        self,
        addrs: str | Sequence[str],
        token: str | None,
        encoding: Encoding,
        backoff: Backoff | None,
        rng: random.Random | None,
        quarantine: float,
    ) -> None:
        self._route = Route(_addresses(addrs), quarantine=quarantine)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.encoding: Encoding = encoding
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()

    @property
    def current(self) -> str:
        """The address the next request tries first (the leader, once one served)."""
        return self._route.current

    @property
    def addresses(self) -> list[str]:
        """Every address known: the configured ones, then leaders learned from 421s."""
        return list(self._route.urls)


class DatanodeClient(_Common):
    """Blocking client; one per datanode, safe to share between threads of one process.

    `addrs`: one metasrv address or several (`host:port` or URLs). `encoding`: the heartbeat
    body's (`json`, or `columns` for msgpack columns). `backoff`/`rng`: how `replay_start`
    spaces its retries. `quarantine`: seconds an unreachable address is not followed to.
    """

    def __init__(
        self,
        addrs: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 3.0,
        encoding: Encoding = "json",
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        quarantine: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(addrs, token, encoding, backoff, rng, quarantine)
        self._sleep = sleep
        self._http = httpx.Client(headers=self._headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> DatanodeClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def heartbeat(self, body: Body) -> wire.HeartbeatResponse:
        """Send one heartbeat to the leader (one attempt across the cluster)."""
        content, content_type = encode_heartbeat(body, self.encoding)
        response = self._send("POST", HEARTBEAT_PATH, content, content_type)
        return _answer(response, wire.HeartbeatResponse)

    def replay_start(
        self, region_id: int, *, flushed_entry_id: int | None = None, timeout: float = 30.0
    ) -> int:
        """The entry id region `region_id` replays its WAL from; retried (backoff with
        jitter) while no metasrv serves, for up to `timeout` seconds. `flushed_entry_id`:
        the region's own, from its manifest; the answer is then never below it + 1
        (`replay_from`). Always give it: metasrv's stat of the region may lag."""
        answer = self.replay_answer(region_id, timeout=timeout)
        return replay_from(answer.start_entry_id, flushed_entry_id)

    def replay_answer(self, region_id: int, *, timeout: float = 30.0) -> wire.ReplayStart:
        """metasrv's whole replay-start answer (with Kafka's log start and the archive's
        objects to replay first: `replay_region` reads them), retried as `replay_start`."""
        deadline = time.monotonic() + timeout
        path = REPLAY_START_PATH.format(region_id=region_id)
        failures = 0
        while True:
            try:
                return _answer(self._send("GET", path), wire.ReplayStart)
            except (NotLeader, Unavailable):
                delay = self.backoff.delay(failures, self.rng)
                if time.monotonic() + delay > deadline:
                    raise
                failures += 1
                self._sleep(delay)

    def _send(
        self, method: str, path: str, content: bytes | None = None, content_type: str = ""
    ) -> httpx.Response:
        attempt = self._route.attempt()
        headers = {"content-type": content_type} if content_type else None
        last: MetasrvError | None = None
        while (url := attempt.next()) is not None:
            try:
                response = self._http.request(method, url + path, content=content, headers=headers)
            except httpx.TransportError as exc:
                last = _unreachable(attempt, url, exc)
                continue
            last = _judge(attempt, url, response)
            if last is None:
                return response
        assert last is not None  # an attempt tries at least one address
        raise last


class AsyncDatanodeClient(_Common):
    """`DatanodeClient` for asyncio: the same routing rules, `await`ed."""

    def __init__(
        self,
        addrs: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 3.0,
        encoding: Encoding = "json",
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        quarantine: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(addrs, token, encoding, backoff, rng, quarantine)
        self._http = httpx.AsyncClient(headers=self._headers, timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncDatanodeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def heartbeat(self, body: Body) -> wire.HeartbeatResponse:
        """Send one heartbeat to the leader (one attempt across the cluster)."""
        content, content_type = encode_heartbeat(body, self.encoding)
        response = await self._send("POST", HEARTBEAT_PATH, content, content_type)
        return _answer(response, wire.HeartbeatResponse)

    async def replay_start(
        self, region_id: int, *, flushed_entry_id: int | None = None, timeout: float = 30.0
    ) -> int:
        """As `DatanodeClient.replay_start`."""
        answer = await self.replay_answer(region_id, timeout=timeout)
        return replay_from(answer.start_entry_id, flushed_entry_id)

    async def replay_answer(self, region_id: int, *, timeout: float = 30.0) -> wire.ReplayStart:
        """As `DatanodeClient.replay_answer`."""
        deadline = time.monotonic() + timeout
        path = REPLAY_START_PATH.format(region_id=region_id)
        failures = 0
        while True:
            try:
                return _answer(await self._send("GET", path), wire.ReplayStart)
            except (NotLeader, Unavailable):
                delay = self.backoff.delay(failures, self.rng)
                if time.monotonic() + delay > deadline:
                    raise
                failures += 1
                await asyncio.sleep(delay)

    async def _send(
        self, method: str, path: str, content: bytes | None = None, content_type: str = ""
    ) -> httpx.Response:
        attempt = self._route.attempt()
        headers = {"content-type": content_type} if content_type else None
        last: MetasrvError | None = None
        while (url := attempt.next()) is not None:
            try:
                response = await self._http.request(
                    method, url + path, content=content, headers=headers
                )
            except httpx.TransportError as exc:
                last = _unreachable(attempt, url, exc)
                continue
            last = _judge(attempt, url, response)
            if last is None:
                return response
        assert last is not None
        raise last
