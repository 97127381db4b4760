"""metasrv.client: decoding answers and mapping errors; the live API is exercised in
test_cli_ops."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from metasrv import errors, wire
from metasrv.wire import MetasrvClient, base_url_from_addr, error_from_response


def _response(status: int, body: Any = None, *, text: str | None = None) -> httpx.Response:
    request = httpx.Request("GET", "http://metasrv.test/v1/x")
    if text is not None:
        return httpx.Response(status, text=text, request=request)
    return httpx.Response(status, json=body, request=request)


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (404, "not_found", errors.NotFound),
        (409, "conflict", errors.Conflict),
        (401, "unauthenticated", errors.Unauthenticated),
        (403, "permission_denied", errors.PermissionDenied),
        (422, "invalid_argument", errors.InvalidArgument),
        (503, "kafka_unavailable", errors.KafkaUnavailable),
        (503, "kv_unavailable", errors.KvUnavailable),
        (409, "lock_not_acquired", errors.LockNotAcquired),
        (500, "wal_data_loss", errors.WalDataLoss),
    ],
)
def test_error_code_selects_the_class(
    status: int, code: str, expected: type[errors.MetasrvError]
) -> None:
    err = error_from_response(_response(status, {"error": {"code": code, "message": "boom"}}))
    assert type(err) is expected
    assert err.message == "boom"
    assert err.code == code


def test_unknown_code_falls_back_to_status_and_keeps_the_code() -> None:
    err = error_from_response(
        _response(413, {"error": {"code": "payload_too_large", "message": "too big"}})
    )
    assert isinstance(err, errors.InvalidArgument)
    assert err.code == "payload_too_large"


def test_non_json_error_uses_status() -> None:
    err = error_from_response(_response(502, text="<html>bad gateway</html>"))
    assert isinstance(err, errors.Unavailable)
    assert "502" in err.message


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": "not_leader", "message": "m", "leader": "10.0.0.2:4000"}},
        {"error": {"code": "not_leader", "message": "m", "details": {"leader": "10.0.0.2:4000"}}},
    ],
)
def test_not_leader_carries_the_leader(body: dict[str, Any]) -> None:
    err = error_from_response(_response(421, body))
    assert isinstance(err, errors.NotLeader)
    assert err.leader == "10.0.0.2:4000"


def test_extra_error_fields_become_details() -> None:
    body = {"error": {"code": "conflict", "message": "m", "procedure_id": "p1"}}
    err = error_from_response(_response(409, body))
    assert err.details == {"procedure_id": "p1"}


@pytest.mark.parametrize(
    ("addr", "url"),
    [
        ("127.0.0.1:4000", "http://127.0.0.1:4000"),
        ("0.0.0.0:4000", "http://127.0.0.1:4000"),
        ("[::]:4000", "http://127.0.0.1:4000"),
        ("metasrv-1:4000", "http://metasrv-1:4000"),
        ("https://m.example:443/", "https://m.example:443"),
    ],
)
def test_base_url_from_addr(addr: str, url: str) -> None:
    assert base_url_from_addr(addr) == url


def _answering(body: Any) -> MetasrvClient:
    """A client whose every request is answered 200 with `body`."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    return MetasrvClient("http://metasrv.test", transport=transport)


def test_plans_decode_blockers_and_nulls_and_ignore_unknown_fields() -> None:
    plan = {
        "topic": "wal_0",
        "prune_point": None,
        "pruned_entry_id": 41,
        "log_start_offset": 42,
        "high_watermark": 100,
        "blocked_by": [{"region_id": 4294967296, "reason": "stale_stat"}],
        "reclaimable_entries": 0,
        "data_loss": [],
        "region_count": 3,
        "future_field": "ignored",
    }
    with _answering({"topics": [plan]}) as client:
        (decoded,) = client.plan()
    assert decoded.prune_point is None
    assert decoded.pruned_entry_id == 41
    assert decoded.blocked_by == [
        wire.BlockingRegion(region_id=4294967296, reason=wire.BlockReason.STALE_STAT)
    ]
    assert decoded.region_count == 3
    assert decoded.data_loss == []


def test_an_answer_of_the_wrong_shape_is_an_error() -> None:
    with (
        _answering({"topics": [{"topic": "wal_0"}]}) as client,
        pytest.raises(errors.MetasrvError, match="unexpected answer"),
    ):
        client.plan()


def test_procedures_and_history_decode() -> None:
    procedure = {
        "id": "p1",
        "kind": "wal_purge",
        "topic": "wal_0",
        "state": "failed",
        "step": "purge",
        "attempts": 3,
        "error": "kafka_unavailable: timed out",
        "error_code": "kafka_unavailable",
        "reason": "manual",
        "outcome": None,
        "submitted_at": "2025-01-01T00:00:00+00:00",
        "started_at": "2025-01-01T00:00:01+00:00",
        "finished_at": "2025-01-01T00:00:05+00:00",
        "timings": {"prepare": 1.0, "flush": 2.5},
        "data": {},
    }
    with _answering(procedure) as client:
        proc = client.procedure("p1")
    assert proc.terminal and proc.failed
    assert proc.timings == {"prepare": 1.0, "flush": 2.5}
    assert proc.finished_at is not None and proc.started_at is not None
    assert (proc.finished_at - proc.started_at).total_seconds() == 4
    with _answering({**procedure, "state": "retrying"}) as client:
        assert not client.procedure("p1").terminal

    record = {
        "procedure_id": "p1",
        "topic": "wal_0",
        "prune_point": 10,
        "previous_pruned_entry_id": None,
        "previous_log_start": 0,
        "low_watermark": 10,
        "entries_deleted": 10,
        "bytes_estimated": 1000,
        "logical_delete": False,
        "duration_s": 0.5,
        "finished_at": "2025-01-01T00:00:05Z",
    }
    with _answering({"purges": [record]}) as client:
        (decoded,) = client.history()
    assert decoded.previous_pruned_entry_id is None
    assert decoded.finished_at.tzinfo is not None


def test_unreachable_server_is_unavailable() -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    with (
        MetasrvClient("127.0.0.1:9", timeout=2.0) as client,
        pytest.raises(errors.Unavailable, match="unreachable"),
    ):
        client.plan()


def test_a_followers_421_is_followed_to_the_leader_once() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}:{request.url.port}")
        if request.url.port == 4001:
            body = {"error": {"code": "not_leader", "message": "m", "leader": "127.0.0.1:4002"}}
            return httpx.Response(421, json=body)
        return httpx.Response(202, json={"procedure_ids": ["p1"]})

    with MetasrvClient(
        "127.0.0.1:4001", token="t", transport=httpx.MockTransport(handler)
    ) as client:
        assert client.purge(["wal_0"]) == ["p1"]
        assert client.base_url == "http://127.0.0.1:4002"
    assert seen == ["127.0.0.1:4001", "127.0.0.1:4002"]


def test_a_second_421_is_an_error_not_a_loop() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        leader = f"127.0.0.1:{(request.url.port or 0) + 1}"
        body = {"error": {"code": "not_leader", "message": "m", "leader": leader}}
        return httpx.Response(421, json=body)

    with (
        MetasrvClient("127.0.0.1:4001", transport=httpx.MockTransport(handler)) as client,
        pytest.raises(errors.NotLeader) as caught,
    ):
        client.procedures()
    assert caught.value.leader == "127.0.0.1:4003"
