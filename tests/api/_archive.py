"""What the archive's API tests set up over HTTP: a region that needs entries a trim deleted,
and a purge waited for until it ends."""

from __future__ import annotations

from typing import Any

import httpx

from metasrv.archive import WalRecord
from tests._archive import produce_records, trim
from tests._wait import wait_until
from tests.api.conftest import heartbeat, region

TERMINAL = ("succeeded", "skipped", "failed", "cancelled")


def losing_region(
    client: httpx.Client,
    kafka_bootstrap: str,
    region_id: int,
    topic: str,
    *,
    flushed: int = 5,
    log_start: int = 20,
    records: int = 30,
) -> list[WalRecord]:
    """Region `region_id` on `topic` (node 1) with `records` records, reporting `flushed`, so
    it needs entries from `flushed + 1`; then an out-of-band trim to `log_start` deletes some
    of them. Returns the records produced."""
    answer = client.post("/v1/regions", json={"region_id": region_id, "node_id": 1, "topic": topic})
    assert answer.status_code == 201, answer.text
    produced = produce_records(kafka_bootstrap, topic, records)
    answer = client.post("/v1/heartbeat", json=heartbeat(1, [region(region_id, topic, flushed)]))
    assert answer.status_code == 200 and not answer.json()["rejected"], answer.text
    assert trim(kafka_bootstrap, topic, log_start) == log_start
    return produced


def purge_to_end(client: httpx.Client, topic: str) -> dict[str, Any]:
    """`POST /v1/purge` of `topic`; waits until the procedure ends and returns its view."""
    answer = client.post("/v1/purge", json={"topics": [topic], "dry_run": False})
    assert answer.status_code == 202, answer.text
    [procedure_id] = answer.json()["procedure_ids"]

    def ended() -> dict[str, Any] | None:
        view: dict[str, Any] = client.get(f"/v1/procedures/{procedure_id}").json()
        return view if view["state"] in TERMINAL else None

    return wait_until(ended, f"the purge of {topic} ends")
