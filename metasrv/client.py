"""Typed HTTP client over metasrv's REST API (DESIGN §5).

The CLI's operator commands use it, and so can the demo and the datanode simulator.
Every error response is turned back into the `metasrv.errors` class whose `code` the
server sent, so callers handle `NotFound`, `Conflict`, `Unauthenticated`... exactly as
server-side code does. A transport failure (refused, timed out) is `Unavailable`.

Responses become frozen dataclasses; unknown fields are ignored so a newer server does
not break an older client.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Final

import httpx

from metasrv import errors
from metasrv.model import BlockingRegion, TopicPlan

TERMINAL_STATES: Final = frozenset({"succeeded", "skipped", "failed", "cancelled"})
"""Procedure states that never change again."""

FAILED_STATES: Final = frozenset({"failed", "cancelled"})
"""Terminal states that mean the purge did not happen."""


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


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_time(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


# --- response views ----------------------------------------------------------------------


def plan_from_json(data: Mapping[str, Any]) -> TopicPlan:
    """One `GET /v1/purge/plan` item as the domain `TopicPlan`."""
    blocked = tuple(
        BlockingRegion(region_id=int(b["region_id"]), reason=str(b["reason"]))
        for b in data.get("blocked_by") or ()
    )
    return TopicPlan(
        topic=str(data["topic"]),
        prune_point=_opt_int(data.get("prune_point")),
        pruned_entry_id=_opt_int(data.get("pruned_entry_id")),
        log_start_offset=_opt_int(data.get("log_start_offset")),
        high_watermark=_opt_int(data.get("high_watermark")),
        blocked_by=blocked,
        reclaimable_entries=int(data.get("reclaimable_entries") or 0),
        data_loss=tuple(int(r) for r in data.get("data_loss") or ()),
        region_count=int(data.get("region_count") or 0),
    )


@dataclass(frozen=True, slots=True)
class ProcedureInfo:
    """A procedure as `GET /v1/procedures/{id}` shows it."""

    id: str
    """Procedure id."""
    kind: str
    """Procedure kind, e.g. `wal_purge`."""
    topic: str | None
    """Topic it works on."""
    state: str
    """pending, running, retrying, succeeded, skipped, failed or cancelled."""
    step: str | None
    """Current (or last) step."""
    attempts: int
    """Attempts of the current step."""
    error: str | None
    """Last error, if any."""
    error_code: str | None
    """Stable code of the last error."""
    reason: str
    """Why it was submitted (`manual`, `ticker`...)."""
    outcome: str | None
    """Terminal summary: what it purged, or why it was skipped."""
    submitted_at: datetime | None
    """When it was submitted."""
    started_at: datetime | None
    """When its first step started."""
    finished_at: datetime | None
    """When it reached a terminal state."""
    timings: dict[str, float]
    """Seconds spent per finished step."""

    @property
    def terminal(self) -> bool:
        """True once the state can no longer change."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcedureInfo:
        """Parse one procedure object."""
        return cls(
            id=str(data["id"]),
            kind=str(data.get("kind", "")),
            topic=data.get("topic"),
            state=str(data["state"]),
            step=data.get("step"),
            attempts=int(data.get("attempts") or 0),
            error=data.get("error"),
            error_code=data.get("error_code"),
            reason=str(data.get("reason") or ""),
            outcome=data.get("outcome"),
            submitted_at=_opt_time(data.get("submitted_at")),
            started_at=_opt_time(data.get("started_at")),
            finished_at=_opt_time(data.get("finished_at")),
            timings={str(k): float(v) for k, v in (data.get("timings") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class PurgeRecord:
    """One completed purge from `GET /v1/purge/history`."""

    procedure_id: str
    """Procedure that did it."""
    topic: str
    """Purged topic."""
    prune_point: int
    """P: offsets below it were deleted (or marked, with logical delete)."""
    previous_pruned_entry_id: int | None
    """The marker before this purge."""
    previous_log_start: int | None
    """Kafka's log start offset before this purge."""
    low_watermark: int | None
    """Kafka's log start offset after DeleteRecords (None with logical delete)."""
    entries_deleted: int
    """Entries this purge removed."""
    bytes_estimated: int
    """Estimated bytes reclaimed."""
    logical_delete: bool
    """True when only the marker moved."""
    duration_s: float
    """Wall time of the procedure."""
    finished_at: datetime
    """When the purge completed."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PurgeRecord:
        """Parse one history row."""
        finished = _opt_time(data.get("finished_at"))
        if finished is None:
            raise errors.InvalidArgument("purge history row without finished_at")
        return cls(
            procedure_id=str(data["procedure_id"]),
            topic=str(data["topic"]),
            prune_point=int(data["prune_point"]),
            previous_pruned_entry_id=_opt_int(data.get("previous_pruned_entry_id")),
            previous_log_start=_opt_int(data.get("previous_log_start")),
            low_watermark=_opt_int(data.get("low_watermark")),
            entries_deleted=int(data.get("entries_deleted") or 0),
            bytes_estimated=int(data.get("bytes_estimated") or 0),
            logical_delete=bool(data.get("logical_delete", False)),
            duration_s=float(data.get("duration_s") or 0.0),
            finished_at=finished,
        )


@dataclass(frozen=True, slots=True)
class WalEvent:
    """One recorded WAL event (e.g. `wal_data_loss`) from `GET /v1/events`."""

    topic: str
    """Topic concerned."""
    kind: str
    """Event kind, e.g. `wal_data_loss`."""
    region_id: int | None
    """Region concerned, if one."""
    details: dict[str, Any]
    """Kind-specific facts (needed entry, log start...)."""
    at: datetime
    """When it was detected."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WalEvent:
        """Parse one event."""
        at = _opt_time(data.get("at"))
        if at is None:
            raise errors.InvalidArgument("event without a time")
        return cls(
            topic=str(data["topic"]),
            kind=str(data["kind"]),
            region_id=_opt_int(data.get("region_id")),
            details=dict(data.get("details") or {}),
            at=at,
        )


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """A registered region, as `GET /v1/regions/{id}` shows it."""

    region_id: int
    """64-bit region id."""
    topic: str
    """Mapped topic."""
    node_id: int | None
    """Datanode it was registered on."""
    raw: dict[str, Any]
    """The whole object (stat fields vary with what the leader holds)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegionInfo:
        """Parse one region object."""
        return cls(
            region_id=int(data["region_id"]),
            topic=str(data["topic"]),
            node_id=_opt_int(data.get("node_id")),
            raw=dict(data),
        )


# --- the client -------------------------------------------------------------------------


def base_url_from_addr(addr: str) -> str:
    """`http.addr` ("host:port") as a URL a client can reach; wildcard hosts become loopback."""
    if "://" in addr:
        return addr.rstrip("/")
    host, _, port = addr.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


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
                response = self._http.request(method, path, params=clean, json=json)
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

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # --- read side ---

    def health(self) -> bool:
        """True when `GET /healthz` answers 2xx."""
        self._request("GET", "/healthz")
        return True

    def leader(self) -> dict[str, Any]:
        """`GET /v1/leader` as returned."""
        result: dict[str, Any] = self._json("GET", "/v1/leader")
        return result

    def plan(self, topic: str | None = None) -> list[TopicPlan]:
        """`GET /v1/purge/plan`: every topic's prune plan, or one topic's."""
        body = self._json("GET", "/v1/purge/plan", params={"topic": topic})
        return [plan_from_json(item) for item in _items(body, "topics")]

    def topics(self) -> list[dict[str, Any]]:
        """`GET /v1/topics` items as returned."""
        return [dict(t) for t in _items(self._json("GET", "/v1/topics"), "topics")]

    def region(self, region_id: int) -> RegionInfo:
        """`GET /v1/regions/{region_id}`."""
        return RegionInfo.from_json(self._json("GET", f"/v1/regions/{region_id}"))

    def regions(self, topic: str | None = None) -> list[RegionInfo]:
        """`GET /v1/regions[?topic=]`: every registered region."""
        body = self._json("GET", "/v1/regions", params={"topic": topic})
        return [RegionInfo.from_json(r) for r in _items(body, "regions")]

    def procedures(self, state: str | None = None) -> list[ProcedureInfo]:
        """`GET /v1/procedures[?state=]`."""
        body = self._json("GET", "/v1/procedures", params={"state": state})
        return [ProcedureInfo.from_json(p) for p in _items(body, "procedures")]

    def procedure(self, procedure_id: str) -> ProcedureInfo:
        """`GET /v1/procedures/{id}`."""
        return ProcedureInfo.from_json(self._json("GET", f"/v1/procedures/{procedure_id}"))

    def history(self, topic: str | None = None, limit: int | None = None) -> list[PurgeRecord]:
        """`GET /v1/purge/history[?topic=&limit=]`, newest first."""
        body = self._json("GET", "/v1/purge/history", params={"topic": topic, "limit": limit})
        return [PurgeRecord.from_json(r) for r in _items(body, "purges")]

    def events(
        self, topic: str | None = None, kind: str | None = None, limit: int | None = None
    ) -> list[WalEvent]:
        """`GET /v1/events[?topic=&kind=&limit=]`, newest first."""
        body = self._json(
            "GET", "/v1/events", params={"topic": topic, "kind": kind, "limit": limit}
        )
        return [WalEvent.from_json(e) for e in _items(body, "events")]

    def metrics_text(self) -> str:
        """`GET /metrics` in the Prometheus text format."""
        return self._request("GET", "/metrics").text

    # --- operator side ---

    def purge(self, topics: Sequence[str] | None = None) -> list[str]:
        """`POST /v1/purge`: submit purges; returns the procedure ids."""
        body = self._json(
            "POST",
            "/v1/purge",
            json={"topics": list(topics) if topics is not None else None, "dry_run": False},
        )
        return [str(i) for i in body["procedure_ids"]]

    def purge_dry_run(self, topics: Sequence[str] | None = None) -> list[TopicPlan]:
        """`POST /v1/purge` with `dry_run`: the plan a purge would follow now."""
        body = self._json(
            "POST",
            "/v1/purge",
            json={"topics": list(topics) if topics is not None else None, "dry_run": True},
        )
        return [plan_from_json(item) for item in _items(body, "topics")]

    def cancel(self, procedure_id: str) -> ProcedureInfo:
        """`POST /v1/procedures/{id}/cancel`; returns the procedure after the request."""
        return ProcedureInfo.from_json(self._json("POST", f"/v1/procedures/{procedure_id}/cancel"))

    def wait(
        self,
        procedure_ids: Iterable[str],
        *,
        timeout: float = 300.0,
        poll_interval: float = 0.5,
    ) -> list[ProcedureInfo]:
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

    def add_region(self, region_id: int, node_id: int, topic: str | None = None) -> RegionInfo:
        """`POST /v1/regions`: register a region (metasrv picks the topic unless given)."""
        payload: dict[str, Any] = {"region_id": region_id, "node_id": node_id}
        if topic is not None:
            payload["topic"] = topic
        body = self._json("POST", "/v1/regions", json=payload)
        body.setdefault("node_id", node_id)
        return RegionInfo.from_json(body)

    def drop_region(self, region_id: int) -> None:
        """`DELETE /v1/regions/{region_id}`."""
        self._request("DELETE", f"/v1/regions/{region_id}")

    # --- datanode side ---

    def heartbeat(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """`POST /v1/heartbeat` with a DESIGN §5 body; returns the response body."""
        result: dict[str, Any] = self._json("POST", "/v1/heartbeat", json=dict(payload))
        return result

    def replay_start(self, region_id: int) -> int:
        """`GET /v1/regions/{id}/replay-start`: the entry id a restarting region replays from."""
        body = self._json("GET", f"/v1/regions/{region_id}/replay-start")
        return int(body["start_entry_id"])


def _items(body: Any, key: str) -> list[Any]:
    """A list response, bare or wrapped as `{key: [...]}`."""
    if isinstance(body, list):
        return body
    if isinstance(body, dict) and isinstance(body.get(key), list):
        return list(body[key])
    raise errors.MetasrvError(f"unexpected response shape: expected a list or {{{key!r}: [...]}}")
