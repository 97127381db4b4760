"""Typed HTTP client over metasrv's REST API (DESIGN §5).

The CLI's operator commands use it, and so can the demo and the datanode simulator.
Every error response is turned back into the `metasrv.errors` class whose `code` the
server sent, so callers handle `NotFound`, `Conflict`, `Unauthenticated`... exactly as
server-side code does. A transport failure (refused, timed out) is `Unavailable`.

Answers are decoded into the `metasrv.wire` structs the server encodes them from;
unknown fields are ignored, so a newer server does not break an older client.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from metasrv import errors
from metasrv.settings import WILDCARD_HOSTS, split_host_port
from metasrv.wire._bodies import (
    Leader,
    PlanList,
    Procedure,
    ProcedureList,
    PurgeHistory,
    PurgeRecord,
    PurgeRequest,
    PurgeSubmitted,
    Region,
    RegionList,
    RegisteredRegion,
    RegisterRegion,
    ReplayStart,
    ResetResolved,
    ResolveReset,
    Topic,
    TopicList,
    TopicPlan,
    WalEvent,
    WalEventList,
)
from metasrv.wire._codec import encode
from metasrv.wire._heartbeat import HeartbeatResponse

T = TypeVar("T")


def _error_classes() -> dict[str, type[errors.MetasrvError]]:
    """Every concrete error class by its wire `code` (walks the hierarchy once)."""
    found: dict[str, type[errors.MetasrvError]] = {}
    pending: list[type[errors.MetasrvError]] = [errors.MetasrvError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


_BY_CODE: Final = _error_classes()

# When the body names no known code, the status decides (e.g. a proxy's bare 502).
_BY_STATUS: Final[dict[int, type[errors.MetasrvError]]] = {
    400: errors.InvalidArgument,
    401: errors.Unauthenticated,
    403: errors.PermissionDenied,
    404: errors.NotFound,
    409: errors.Conflict,
    413: errors.InvalidArgument,
    422: errors.InvalidArgument,
    502: errors.Unavailable,
    503: errors.Unavailable,
    504: errors.Unavailable,
}


def error_from_response(response: httpx.Response) -> errors.MetasrvError:
    """The `MetasrvError` an error response stands for (pure; no I/O)."""
    code: str | None = None
    message = f"HTTP {response.status_code} from {response.request.url}"
    details: dict[str, Any] = {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = str(err.get("message", message))
        details = {k: v for k, v in err.items() if k not in ("code", "message", "details")}
        if isinstance(err.get("details"), dict):
            details.update(err["details"])
    elif isinstance(body, dict) and "detail" in body:
        message = str(body["detail"])
    if response.status_code == 421 or code == errors.NotLeader.code:
        leader = details.get("leader")
        return errors.NotLeader(leader if isinstance(leader, str) else None)
    cls = _BY_CODE.get(code) if code else None
    if cls is None or cls is errors.NotLeader:
        cls = _BY_STATUS.get(response.status_code, errors.MetasrvError)
    exc = cls(message, details=details)
    if code and cls.code != code:
        exc.code = code
    return exc


# --- the client -------------------------------------------------------------------------


def base_url_from_addr(addr: str) -> str:
    """`http.addr` ("host:port") as a URL a client can reach; wildcard hosts become loopback."""
    if "://" in addr:
        return addr.rstrip("/")
    parsed = split_host_port(addr)
    if parsed is None:
        raise errors.InvalidArgument(f"a metasrv address is host:port, got {addr!r}")
    host, port = parsed
    return f"http://{'127.0.0.1' if host in WILDCARD_HOSTS else host}:{port}"


class MetasrvClient:
    """Blocking client of one metasrv; follows a follower's 421 to the leader once per call.

    Use as a context manager, or call `close()`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        follow_leader: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._follow_leader = follow_leader
        self._http = httpx.Client(
            base_url=base_url_from_addr(base_url),
            headers=headers,
            timeout=timeout,
            transport=transport,
        )

    @property
    def base_url(self) -> str:
        """The URL of the metasrv this client talks to (changes after following a leader)."""
        return str(self._http.base_url).rstrip("/")

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> MetasrvClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
    ) -> httpx.Response:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        for attempt in (0, 1):
            try:
                response = self._http.request(
                    method,
                    path,
                    params=clean,
                    content=None if json is None else encode(json),
                    headers=None if json is None else {"content-type": "application/json"},
                )
            except httpx.TransportError as exc:
                raise errors.Unavailable(
                    f"metasrv at {self.base_url} is unreachable: {exc}"
                ) from exc
            if response.is_success:
                return response
            err = error_from_response(response)
            if (
                isinstance(err, errors.NotLeader)
                and err.leader
                and self._follow_leader
                and attempt == 0
            ):
                # Only the leader serves writes; a follower names it in the 421 body.
                self._http.base_url = httpx.URL(base_url_from_addr(err.leader))
                continue
            raise err
        raise AssertionError("unreachable")  # pragma: no cover

    def _get(self, kind: type[T], method: str, path: str, **kwargs: Any) -> T:
        """The answer to one request, decoded as `kind`."""
        content = self._request(method, path, **kwargs).content
        try:
            return msgspec.json.decode(content, type=kind)
        except msgspec.DecodeError as exc:
            raise errors.MetasrvError(f"unexpected answer to {method} {path}: {exc}") from exc

    def raw(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
    ) -> bytes:
        """The answer's body as the server sent it, for callers that pass it on unchanged
        (the CLI's `--json`); errors are raised as for every other call."""
        return self._request(method, path, params=params, json=json).content

    # --- read side ---

    def health(self) -> bool:
        """True when `GET /healthz` answers 2xx."""
        self._request("GET", "/healthz")
        return True

    def leader(self) -> Leader:
        return self._get(Leader, "GET", "/v1/leader")

    def plan(self, topic: str | None = None) -> list[TopicPlan]:
        """Every topic's prune plan, or one topic's."""
        return self._get(PlanList, "GET", "/v1/purge/plan", params={"topic": topic}).topics

    def topics(self) -> list[Topic]:
        return self._get(TopicList, "GET", "/v1/topics").topics

    def topic(self, topic: str) -> Topic:
        """One topic's plan, datanode report and durability (read afresh from Kafka)."""
        return self._get(Topic, "GET", f"/v1/topics/{quote(topic, safe='')}")

    def region(self, region_id: int) -> Region:
        return self._get(Region, "GET", f"/v1/regions/{region_id}")

    def regions(self, topic: str | None = None) -> list[Region]:
        """Every registered region, or one topic's."""
        return self._get(RegionList, "GET", "/v1/regions", params={"topic": topic}).regions

    def procedures(self, state: str | None = None) -> list[Procedure]:
        params = {"state": state}
        return self._get(ProcedureList, "GET", "/v1/procedures", params=params).procedures

    def procedure(self, procedure_id: str) -> Procedure:
        return self._get(Procedure, "GET", f"/v1/procedures/{procedure_id}")

    def history(self, topic: str | None = None, limit: int | None = None) -> list[PurgeRecord]:
        """Completed purges, newest first."""
        params = {"topic": topic, "limit": limit}
        return self._get(PurgeHistory, "GET", "/v1/purge/history", params=params).purges

    def events(
        self,
        topic: str | None = None,
        kind: str | Sequence[str] | None = None,
        limit: int | None = None,
        *,
        since: datetime | None = None,
    ) -> list[WalEvent]:
        """WAL events (prune attempts, `wal_data_loss`), newest first: of `topic`, of
        `kind` (one or several), at or after `since` (an aware datetime)."""
        if since is not None and since.tzinfo is None:
            raise ValueError("since must be an aware datetime")
        params = {
            "topic": topic,
            "kind": [kind] if isinstance(kind, str) else None if kind is None else list(kind),
            "since": None if since is None else since.isoformat(),
            "limit": limit,
        }
        return self._get(WalEventList, "GET", "/v1/events", params=params).events

    # --- operator side ---

    def purge(self, topics: Sequence[str] | None = None) -> list[str]:
        """Submit purges; returns the procedure ids."""
        request = PurgeRequest(topics=None if topics is None else list(topics))
        submitted = self._get(PurgeSubmitted, "POST", "/v1/purge", json=request)
        return submitted.procedure_ids

    def purge_dry_run(self, topics: Sequence[str] | None = None) -> list[TopicPlan]:
        """The plan a purge would follow now."""
        request = PurgeRequest(topics=None if topics is None else list(topics), dry_run=True)
        return self._get(PlanList, "POST", "/v1/purge", json=request).topics

    def cancel(self, procedure_id: str) -> Procedure:
        """Ask a procedure to stop; returns it after the request."""
        return self._get(Procedure, "POST", f"/v1/procedures/{procedure_id}/cancel")

    def wait(
        self,
        procedure_ids: Iterable[str],
        *,
        timeout: float = 300.0,
        poll_interval: float = 0.5,
    ) -> list[Procedure]:
        """Poll until every procedure is terminal; raises `TimeoutError` after `timeout` s."""
        ids = list(procedure_ids)
        deadline = time.monotonic() + timeout
        while True:
            views = [self.procedure(i) for i in ids]
            if all(v.terminal for v in views):
                return views
            if time.monotonic() >= deadline:
                pending = ", ".join(f"{v.id}={v.state}" for v in views if not v.terminal)
                raise TimeoutError(f"procedures not finished after {timeout}s: {pending}")
            time.sleep(poll_interval)

    def add_region(
        self, region_id: int, node_id: int, topic: str | None = None
    ) -> RegisteredRegion:
        """Register a region (metasrv picks the topic unless given)."""
        request = RegisterRegion(region_id=region_id, node_id=node_id, topic=topic)
        return self._get(RegisteredRegion, "POST", "/v1/regions", json=request)

    def resolve_reset(self, topic: str, topic_id: str) -> ResetResolved:
        """Resolve the topic reset latched on `topic`, given Kafka's current id of it."""
        request = ResolveReset(topic_id=topic_id)
        path = f"/v1/topics/{topic}/resolve-reset"
        return self._get(ResetResolved, "POST", path, json=request)

    def drop_region(self, region_id: int) -> None:
        """`DELETE /v1/regions/{region_id}`."""
        self._request("DELETE", f"/v1/regions/{region_id}")

    # --- datanode side ---

    def heartbeat(self, payload: Mapping[str, Any]) -> HeartbeatResponse:
        """Send a DESIGN §5 heartbeat body."""
        return self._get(HeartbeatResponse, "POST", "/v1/heartbeat", json=dict(payload))

    def replay_start(self, region_id: int) -> int:
        """The entry id a restarting region replays from."""
        path = f"/v1/regions/{region_id}/replay-start"
        return self._get(ReplayStart, "GET", path).start_entry_id
