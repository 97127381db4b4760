"""`GET /v1/events` against a real metasrv (etcd kv, Kafka, SQLite history) after purges that
deleted, were skipped (blocked) and failed on WAL data loss: what each attempt recorded,
the `kind`/`topic`/`since`/`limit` filters, bad values answered 422 with nothing changed,
and the leader trimming events past `history.events_retention`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine

from metasrv import wire
from metasrv.wire import EventKind
from procedures import History
from tests._wait import wait_until
from tests.api._live import VIEWER_TOKEN, LiveMetasrv, live_metasrv, purge_and_wait

VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}


class Purged:
    """The served metasrv after one purge per seeded topic."""

    def __init__(self, metasrv: LiveMetasrv, views: list[wire.Procedure], started: datetime):
        self.metasrv = metasrv
        self.by_topic = {v.topic: v for v in views}
        self.started = started
        self.viewer = httpx.Client(base_url=metasrv.url, headers=VIEWER, timeout=30)

    def get(self, **params: Any) -> httpx.Response:
        return self.viewer.get("/v1/events", params=params)

    def events(self, **params: Any) -> list[dict[str, Any]]:
        response = self.get(**params)
        assert response.status_code == 200, response.text
        events: list[dict[str, Any]] = response.json()["events"]
        return events


@pytest.fixture(scope="module")
def purged(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Purged]:
    workdir = tmp_path_factory.mktemp("events-api")
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir) as metasrv:
        w = metasrv.world
        started = datetime.now(UTC)
        views = purge_and_wait(metasrv.url, [w.purgeable_topic, w.blocked_topic, w.loss_topic])
        state = Purged(metasrv, views, started)
        try:
            yield state
        finally:
            state.viewer.close()


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


def test_each_purge_attempt_is_in_the_events(purged: Purged) -> None:
    w = purged.metasrv.world
    deleted_by = purged.by_topic[w.purgeable_topic]
    assert deleted_by.state == "succeeded"
    events = purged.events(topic=w.purgeable_topic)
    assert _kinds(events) == ["purge_deleted", "purge_started"]  # newest first
    deleted = events[0]
    assert deleted["procedure_id"] == deleted_by.id
    assert deleted["target"] == w.prune_point
    assert (deleted["log_start_before"], deleted["log_start_after"]) == (0, w.prune_point)
    assert deleted["high_watermark"] == 20
    assert deleted["message"] == deleted_by.outcome
    assert deleted["details"]["trigger"] == "manual"
    assert datetime.fromisoformat(deleted["at"]) >= purged.started

    blocked = purged.events(topic=w.blocked_topic)
    assert _kinds(blocked) == ["purge_skipped", "purge_started"]
    assert blocked[0]["message"] == f"blocked by {w.blocked_region} (no_stat)"
    assert blocked[0]["procedure_id"] == purged.by_topic[w.blocked_topic].id

    lost = purged.events(topic=w.loss_topic)
    assert _kinds(lost) == ["purge_failed", "wal_data_loss", "purge_started"]
    assert lost[0]["details"]["error_code"] == "wal_data_loss"
    assert (lost[0]["log_start_before"], lost[0]["high_watermark"]) == (10, 20)
    assert lost[1]["region_id"] == w.loss_region
    assert (lost[1]["log_start_before"], lost[1]["high_watermark"]) == (10, 20)
    assert {e["procedure_id"] for e in lost} == {purged.by_topic[w.loss_topic].id}


def test_filters_kind_since_and_limit(purged: Purged) -> None:
    w = purged.metasrv.world
    every = purged.events()
    assert len(every) == 7
    problems = purged.events(kind=["purge_failed", "wal_data_loss"])
    assert _kinds(problems) == ["purge_failed", "wal_data_loss"]
    assert {e["topic"] for e in problems} == {w.loss_topic}
    assert _kinds(purged.events(kind="purge_started")) == ["purge_started"] * 3
    assert purged.events(kind="purge_retrying") == []

    assert purged.events(since=purged.started.isoformat()) == every
    later = datetime.fromisoformat(every[0]["at"]) + timedelta(milliseconds=1)
    assert purged.events(since=later.isoformat().replace("+00:00", "Z")) == []
    # The newest event's own time, written in another offset, still finds it.
    newest = datetime.fromisoformat(every[0]["at"])
    offset = newest.astimezone(timezone(timedelta(hours=-5)))
    assert purged.events(since=offset.isoformat()) == every[:1]

    assert purged.events(limit=2) == every[:2]
    assert purged.events(
        topic=w.loss_topic, kind="purge_started", since=purged.started.isoformat()
    ) == [e for e in every if e["topic"] == w.loss_topic and e["kind"] == "purge_started"]


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"kind": "bogus"}, "kind"),
        ({"kind": ""}, "kind"),
        ({"kind": ["purge_failed", "PURGE_FAILED"]}, "kind"),
        ({"since": "yesterday"}, "since"),
        ({"since": "1700000000"}, "since"),
        ({"since": "2026-11-25T08:00:00"}, "since"),  # no offset
        ({"since": "2026-11-25"}, "since"),
        ({"since": "2026-11-25T08:00:00 01:00"}, "%2B"),  # an unencoded '+'
        ({"since": "2026-13-01T00:00:00Z"}, "since"),
        ({"since": "0000-01-01T00:00:00Z"}, "out of range"),
        ({"since": "2026-11-25T08:00:00Z" + "0" * 60}, "since"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"topic": "not a topic"}, "topic"),
    ],
)
def test_bad_values_are_422_and_change_nothing(
    purged: Purged, params: dict[str, Any], names: str
) -> None:
    before = purged.events(limit=1000)
    procedures = purged.viewer.get("/v1/procedures").json()

    response = purged.get(**params)

    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == "validation_error"
    assert names in body["error"]["message"], body
    assert purged.events(limit=1000) == before
    assert purged.viewer.get("/v1/procedures").json() == procedures


def test_the_client_passes_every_filter(purged: Purged) -> None:
    w = purged.metasrv.world
    with wire.MetasrvClient(purged.metasrv.url, token=VIEWER_TOKEN) as client:
        found = client.events(
            topic=w.loss_topic,
            kind=[EventKind.WAL_DATA_LOSS, EventKind.PURGE_FAILED],
            since=purged.started,
            limit=10,
        )
        assert [e.kind for e in found] == ["purge_failed", "wal_data_loss"]
        assert client.events(since=datetime.now(UTC) + timedelta(hours=1)) == []
        with pytest.raises(ValueError, match="aware"):
            client.events(since=datetime.now())


def test_the_leader_deletes_events_past_their_retention(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    workdir = tmp_path_factory.mktemp("events-retention")
    # 30s retention: checked every 7.5s; the events of the purge below stay.
    with live_metasrv(
        kafka_bootstrap, etcd_endpoint, workdir, history={"events_retention": "30s"}
    ) as metasrv:
        w = metasrv.world
        purge_and_wait(metasrv.url, [w.purgeable_topic])
        engine = create_engine(f"sqlite:///{workdir / f'{metasrv.prefix}-history.db'}")
        old = datetime.now(UTC) - timedelta(hours=1)
        stale = [
            wire.WalEvent(
                topic=w.blocked_topic,
                kind="purge_skipped",
                region_id=None,
                details={},
                at=old + timedelta(seconds=i),
            )
            for i in range(3)
        ]
        try:
            asyncio.run(History(engine).record_events(stale))
        finally:
            engine.dispose()
        with httpx.Client(base_url=metasrv.url, headers=VIEWER, timeout=30) as viewer:

            def kinds() -> list[str]:
                events = viewer.get("/v1/events").json()["events"]
                return [e["kind"] for e in events]

            assert kinds() == ["purge_deleted", "purge_started", *["purge_skipped"] * 3]
            wait_until(
                lambda: kinds() == ["purge_deleted", "purge_started"],
                "the skipped events trimmed",
                timeout=20,
                interval=0.25,
            )
