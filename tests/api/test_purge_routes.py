"""Operator routes against a real metasrv (etcd kv, Kafka, SQLite history).

`POST /v1/purge` (and dry run), `/v1/procedures...`, `/v1/purge/history`, `/v1/events`,
and `/metrics` after purges that succeeded, were skipped and failed on data loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metasrv import wire
from metasrv.kafka import KafkaAdmin
from tests.api._live import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    World,
    live_metasrv,
    purge_and_wait,
)


class Live:
    """The served metasrv and what was seeded into it."""

    def __init__(self, url: str, world: World, kafka_bootstrap: str) -> None:
        self.url = url
        self.world = world
        self.kafka_bootstrap = kafka_bootstrap
        self.operator = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=30
        )
        self.viewer = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}, timeout=30
        )
        self.anonymous = httpx.Client(base_url=url, timeout=30)

    def close(self) -> None:
        for client in (self.operator, self.viewer, self.anonymous):
            client.close()


@pytest.fixture(scope="module")
def live(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    workdir = tmp_path_factory.mktemp("purge-routes")
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir) as metasrv:
        state = Live(metasrv.url, metasrv.world, kafka_bootstrap)
        try:
            yield state
        finally:
            state.close()


@pytest.fixture(scope="module")
def outcomes(live: Live) -> dict[str, wire.Procedure]:
    """One purge per seeded topic, each waited for: topic -> final procedure."""
    w = live.world
    topics = [w.purgeable_topic, w.blocked_topic, w.loss_topic]
    views = purge_and_wait(live.url, topics)
    by_topic = {v.topic: v for v in views}
    assert set(by_topic) == set(topics)
    return {t: by_topic[t] for t in topics}


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str)
    return error


def _log_start(live: Live, topic: str) -> int:
    admin = KafkaAdmin(live.kafka_bootstrap)
    try:
        return admin.offsets([topic])[topic].log_start_offset
    finally:
        admin.close()


def test_purge_needs_an_operator_token(live: Live) -> None:
    body = {"topics": [live.world.purgeable_topic], "dry_run": True}
    assert _error(live.anonymous.post("/v1/purge", json=body), 401)["code"] == "unauthenticated"
    assert _error(live.viewer.post("/v1/purge", json=body), 403)["code"] == "permission_denied"
    assert _error(live.viewer.post("/v1/procedures/abc/cancel"), 403)["code"] == (
        "permission_denied"
    )
    for path in ("/v1/procedures", "/v1/purge/history", "/v1/events"):
        assert _error(live.anonymous.get(path), 401)["code"] == "unauthenticated"
        assert live.viewer.get(path).status_code == 200


def test_dry_run_answers_the_plan_and_submits_nothing(live: Live) -> None:
    w = live.world
    before = {p["id"] for p in live.viewer.get("/v1/procedures").json()["procedures"]}
    response = live.operator.post(
        "/v1/purge",
        json={"topics": [w.purgeable_topic, w.blocked_topic, w.loss_topic], "dry_run": True},
    )
    assert response.status_code == 200, response.text
    plans = {p["topic"]: p for p in response.json()["topics"]}
    assert plans[w.purgeable_topic]["prune_point"] == w.prune_point
    assert plans[w.purgeable_topic]["blocked_by"] == []
    assert plans[w.blocked_topic]["prune_point"] is None
    assert plans[w.blocked_topic]["blocked_by"] == [
        {"region_id": w.blocked_region, "reason": "no_stat"}
    ]
    assert plans[w.loss_topic]["data_loss"] == [w.loss_region]
    after = {p["id"] for p in live.viewer.get("/v1/procedures").json()["procedures"]}
    assert after == before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"topics": [], "dry_run": False}, 422, "validation_error"),
        ({"topics": ["not a topic!"]}, 422, "validation_error"),
        ({"topics": None, "dry_run": "yes please"}, 422, "validation_error"),
        ({"topics": None, "surprise": 1}, 422, "validation_error"),
        ({"topics": ["no_such_topic_anywhere"]}, 404, "not_found"),
        ({"topics": ["no_such_topic_anywhere"], "dry_run": True}, 404, "not_found"),
    ],
)
def test_bad_purge_requests_are_4xx(
    live: Live, body: dict[str, Any], status: int, code: str
) -> None:
    before = live.viewer.get("/v1/procedures").json()["procedures"]
    assert _error(live.operator.post("/v1/purge", json=body), status)["code"] == code
    assert live.viewer.get("/v1/procedures").json()["procedures"] == before


def test_bad_reads_are_4xx(live: Live) -> None:
    assert _error(live.viewer.get("/v1/procedures?state=exploded"), 422)
    assert _error(live.viewer.get("/v1/procedures?limit=0"), 422)
    assert _error(live.viewer.get("/v1/purge/history?limit=100000"), 422)
    assert _error(live.viewer.get("/v1/purge/history?topic=bad%20topic"), 422)
    assert _error(live.viewer.get("/v1/procedures/0123abcd"), 404)["code"] == "not_found"
    assert _error(live.operator.post("/v1/procedures/0123abcd/cancel"), 404)
    assert _error(live.operator.post("/v1/purge", content=b"{not json"), 422)


def test_purge_runs_to_completion_and_lands_in_history(
    live: Live, outcomes: dict[str, wire.Procedure]
) -> None:
    w = live.world
    done = outcomes[w.purgeable_topic]
    assert done.state == "succeeded", done
    view = live.viewer.get(f"/v1/procedures/{done.id}").json()
    assert view["state"] == "succeeded"
    assert view["kind"] == "wal_purge"
    assert view["topic"] == w.purgeable_topic
    assert view["finished_at"] >= view["submitted_at"]
    assert set(view["timings"]) >= {"prepare", "purge"}, view["timings"]
    # Kafka really moved: offsets < P are gone, P itself kept (DESIGN §1).
    assert _log_start(live, w.purgeable_topic) == w.prune_point

    history = live.viewer.get(f"/v1/purge/history?topic={w.purgeable_topic}").json()["purges"]
    (row,) = [h for h in history if h["procedure_id"] == done.id]
    assert row["prune_point"] == w.prune_point
    assert row["entries_deleted"] == w.prune_point
    assert row["previous_log_start"] == 0
    assert row["low_watermark"] == w.prune_point
    assert row["logical_delete"] is False
    everything = live.viewer.get("/v1/purge/history?limit=1000").json()["purges"]
    assert {h["topic"] for h in everything} == {w.purgeable_topic}

    plan = live.viewer.get(f"/v1/purge/plan?topic={w.purgeable_topic}").json()["topics"][0]
    assert plan["pruned_entry_id"] == w.prune_point
    assert plan["reclaimable_entries"] == 0

    cancel = live.operator.post(f"/v1/procedures/{done.id}/cancel")
    assert _error(cancel, 409)["code"] == "conflict"
    finished = live.viewer.get("/v1/procedures?state=succeeded").json()["procedures"]
    assert done.id in {p["id"] for p in finished}


def test_blocked_topic_is_skipped_and_untouched(
    live: Live, outcomes: dict[str, wire.Procedure]
) -> None:
    w = live.world
    done = outcomes[w.blocked_topic]
    assert done.state == "skipped", done
    assert done.outcome and str(w.blocked_region) in done.outcome, done.outcome
    assert _log_start(live, w.blocked_topic) == 0


def test_data_loss_fails_the_purge_and_is_reported(
    live: Live, outcomes: dict[str, wire.Procedure]
) -> None:
    w = live.world
    done = outcomes[w.loss_topic]
    assert done.state == "failed", done
    assert done.error_code == "wal_data_loss"
    events = live.viewer.get(f"/v1/events?kind=wal_data_loss&topic={w.loss_topic}").json()["events"]
    assert [e["region_id"] for e in events] == [w.loss_region]
    assert events[0]["details"]["log_start_offset"] == 10
    plan = live.viewer.get(f"/v1/purge/plan?topic={w.loss_topic}").json()["topics"][0]
    assert plan["pruned_entry_id"] is None
    failed = live.viewer.get("/v1/procedures?state=failed").json()["procedures"]
    assert [p["id"] for p in failed] == [done.id]


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, [])
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _value(samples: Samples, name: str, **labels: str) -> float:
    matching = [v for lbl, v in samples[name] if all(lbl.get(k) == x for k, x in labels.items())]
    assert matching, f"no {name} sample with {labels}"
    return sum(matching)


def test_metrics_parse_and_carry_the_purge_series(
    live: Live, outcomes: dict[str, wire.Procedure]
) -> None:
    w = live.world
    assert _error(live.anonymous.get("/metrics"), 401)
    response = live.viewer.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    s = _samples(response.text)
    t0, t2 = w.purgeable_topic, w.loss_topic
    assert _value(s, "metasrv_wal_pruned_entry_id", topic=t0) == w.prune_point
    assert _value(s, "metasrv_wal_prune_point", topic=t0) == w.prune_point
    assert _value(s, "metasrv_wal_purge_lag_entries", topic=t0) == 0
    assert _value(s, "metasrv_wal_log_start_offset", topic=t0) == w.prune_point
    assert _value(s, "metasrv_wal_retained_entries", topic=t0) == 20 - w.prune_point
    assert _value(s, "metasrv_wal_retained_bytes_estimated", topic=t0) > 0
    assert _value(s, "metasrv_wal_blocked_regions", topic=w.blocked_topic) == 1
    assert _value(s, "metasrv_wal_purges_total", topic=t0) == 1
    assert _value(s, "metasrv_wal_entries_deleted_total", topic=t0) == w.prune_point
    assert _value(s, "metasrv_wal_purge_errors_total", topic=t2, kind="wal_data_loss") == 1
    assert _value(s, "metasrv_wal_data_loss_events_total", topic=t2) == 1
    assert _value(s, "metasrv_heartbeats_received_total") >= 2
    assert _value(s, "metasrv_region_stats_rejected_total") >= 1
    assert "metasrv_flush_instructions_sent_total" in s
    for state in ("succeeded", "skipped", "failed"):
        count = _value(s, "metasrv_procedure_duration_seconds_count", kind="wal_purge", state=state)
        assert count == 1, state
    assert s["metasrv_procedure_duration_seconds_bucket"]
    assert _value(s, "metasrv_is_leader") == 1
