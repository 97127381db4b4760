"""Replay-start under a purge in flight, over real HTTP on real etcd and Kafka (issue #34):
an idle region's report without its claim, accepted after the purge step re-validated,
lowers its prunable id below the target the purge is moving the marker to; replay-start
answers above that target, so the region replays from an offset Kafka still holds after
the purge's DeleteRecords."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from api.runtime import Runtime
from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import Compare, Put, TxnOp, TxnResult
from tests._wait import wait_until
from tests.api._live import produce
from tests.api.conftest import SettingsFactory, heartbeat, region, start_server
from tests.metasrv.kafka._recreate import recreate_topic

FLUSHED = 11
IDLE = 12

_HOLD_TIMEOUT = 30.0
_TERMINAL = ("succeeded", "skipped", "failed", "cancelled")


class MarkerWriteHold:
    """Holds the marker write of `topic` (the purge step's CAS, sent after it re-validated
    its target) until `release` is set; `reached` is set when one arrives."""

    def __init__(self, runtime: Runtime, topic: str) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self._key = keys.topic_name(topic)
        self._txn = runtime.purge.committer.txn

    async def txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        if any(isinstance(op, Put) and op.key == self._key for op in ops):
            self.reached.set()
            await asyncio.to_thread(self.release.wait, _HOLD_TIMEOUT)
        return await self._txn(compares, ops)


def _procedure(client: httpx.Client, procedure_id: str) -> dict[str, Any]:
    answer = client.get(f"/v1/procedures/{procedure_id}")
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def _replay_start(client: httpx.Client, region_id: int) -> int:
    answer = client.get(f"/v1/regions/{region_id}/replay-start")
    assert answer.status_code == 200, answer.text
    start: int = answer.json()["start_entry_id"]
    return start


def test_an_idle_region_reporting_lower_under_a_purge_is_answered_above_its_target(
    make_settings: SettingsFactory, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    kafka = KafkaAdmin(kafka_bootstrap)
    with start_server(settings) as srv, srv.client() as c:
        topic = c.post("/v1/regions", json={"region_id": FLUSHED, "node_id": 1}).json()["topic"]
        registered = c.post("/v1/regions", json={"region_id": IDLE, "node_id": 1, "topic": topic})
        assert registered.status_code in (200, 201), registered.text
        produce(kafka_bootstrap, topic, 2)  # entries 0 and 1
        # FLUSHED flushed to 1; IDLE wrote nothing and is idle at the topic's latest, 1.
        sent = c.post(
            "/v1/heartbeat",
            json=heartbeat(
                1, [region(FLUSHED, topic, 1), region(IDLE, topic, -1, latest=1, memtable=0)]
            ),
        )
        assert sent.status_code == 200, sent.text
        assert _replay_start(c, IDLE) == 2

        runtime: Runtime = srv.app.state.runtime
        hold = MarkerWriteHold(runtime, topic)
        monkeypatch.setattr(runtime.purge.committer, "txn", hold.txn)
        try:
            submitted = c.post("/v1/purge", json={"topics": [topic]})
            assert submitted.status_code == 202, submitted.text
            (procedure_id,) = submitted.json()["procedure_ids"]
            # The purge step persisted its intent, re-validated it and sent the CAS.
            assert hold.reached.wait(_HOLD_TIMEOUT), "the purge's marker write never came"
            view = _procedure(c, procedure_id)
            assert view["step"] == "purge" and view["data"]["target"] == 1, view

            # IDLE writes again: its report without the claim lowers its prunable id to -1.
            sent = c.post(
                "/v1/heartbeat", json=heartbeat(1, [region(IDLE, topic, -1, memtable=10)])
            )
            assert sent.status_code == 200, sent.text
            stat = c.get(f"/v1/regions/{IDLE}").json()["stat"]
            assert stat["topic_latest_entry_id"] is None, stat

            # It restarts: not below the target the marker and DeleteRecords will take.
            answered = _replay_start(c, IDLE)
            assert answered == 2, f"replay-start {answered} under a purge to 1"
        finally:
            hold.release.set()

        wait_until(
            lambda: _procedure(c, procedure_id)["state"] in _TERMINAL,
            "the purge finished",
        )
        assert _procedure(c, procedure_id)["state"] == "succeeded"
        log_start = kafka.offsets([topic])[topic].log_start_offset
        assert log_start == 1
        # What the region was answered is readable: it replays from 2 >= the log start.
        assert answered >= log_start
        assert _replay_start(c, IDLE) == 2


def test_replay_start_under_a_purge_of_a_recreated_topic_answers_no_offset(
    make_settings: SettingsFactory, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The purge in flight planned on the old topic: its target counts offsets of a topic
    # that is gone, and a floor taken from it would skip the new topic's entries.
    settings = make_settings()
    kafka = KafkaAdmin(kafka_bootstrap)
    with start_server(settings) as srv, srv.client() as c:
        topic = c.post("/v1/regions", json={"region_id": FLUSHED, "node_id": 1}).json()["topic"]
        produce(kafka_bootstrap, topic, 2)
        sent = c.post("/v1/heartbeat", json=heartbeat(1, [region(FLUSHED, topic, 1)]))
        assert sent.status_code == 200, sent.text
        runtime: Runtime = srv.app.state.runtime
        hold = MarkerWriteHold(runtime, topic)
        monkeypatch.setattr(runtime.purge.committer, "txn", hold.txn)
        try:
            submitted = c.post("/v1/purge", json={"topics": [topic]})
            assert submitted.status_code == 202, submitted.text
            assert hold.reached.wait(_HOLD_TIMEOUT), "the purge's marker write never came"
            recreate_topic(kafka, topic)
            produce(kafka_bootstrap, topic, 1)  # the region writes entry 0 of the new topic
            answer = c.get(f"/v1/regions/{FLUSHED}/replay-start")
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"]["code"] == "topic_reset"
        finally:
            hold.release.set()
