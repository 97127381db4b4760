"""Pinned consumer groups through the served API (DESIGN §5, §8), on a real metasrv, Kafka
and etcd: a pinned group with no committed offset is a `blocked_by` entry naming
`consumer_group` instead of a region, every group's lag is in the plan and in `/metrics`,
and once the group commits, the plan and the purge stop at its committed offset.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metasrv.kafka import KafkaAdmin
from tests._archive import commit_offset
from tests.api._live import (
    RECORDS_PER_TOPIC,
    VIEWER_TOKEN,
    LiveMetasrv,
    live_metasrv,
    purge_and_wait,
)

_RUN = uuid.uuid4().hex[:8]
CDC, SILENT = f"pin-{_RUN}-cdc", f"pin-{_RUN}-silent"


@pytest.fixture(scope="module")
def live(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveMetasrv]:
    workdir: Path = tmp_path_factory.mktemp("pinned-groups")
    pins = {"pin_consumer_groups": [CDC, SILENT]}
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir, wal=pins) as metasrv:
        yield metasrv


@pytest.fixture
def viewer(live: LiveMetasrv) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=live.url, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}, timeout=30
    ) as client:
        yield client


def _gauges(viewer: httpx.Client, name: str, topic: str) -> dict[str, float]:
    """Each group's sample of gauge `name` on `topic`, as `/metrics` serves it."""
    response = viewer.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        sample.labels["group"]: sample.value
        for family in text_string_to_metric_families(response.text)
        if family.name == name
        for sample in family.samples
        if sample.labels.get("topic") == topic
    }


def test_a_group_without_an_offset_blocks_then_one_behind_bounds_the_purge(
    live: LiveMetasrv, viewer: httpx.Client, kafka_bootstrap: str
) -> None:
    topic = live.world.purgeable_topic  # its regions allow P = 9
    commit_offset(kafka_bootstrap, CDC, topic, 5)

    response = viewer.get("/v1/purge/plan", params={"topic": topic})
    assert response.status_code == 200, response.text
    [plan] = response.json()["topics"]
    assert plan["prune_point"] is None
    assert plan["blocked_by"] == [{"consumer_group": SILENT, "reason": "no_committed_offset"}]
    assert sorted(plan["pinned_groups"], key=lambda g: g["consumer_group"]) == [
        {"consumer_group": CDC, "committed_offset": 5, "lag": RECORDS_PER_TOPIC - 5,
         "holds_prune_point": False},
        {"consumer_group": SILENT, "committed_offset": None, "lag": None,
         "holds_prune_point": False},
    ]  # fmt: skip
    assert _gauges(viewer, "metasrv_wal_pinned_group_blocking", topic) == {CDC: 0, SILENT: 1}
    assert _gauges(viewer, "metasrv_wal_pinned_group_lag", topic) == {CDC: RECORDS_PER_TOPIC - 5}

    commit_offset(kafka_bootstrap, SILENT, topic, 12)
    [plan] = viewer.get("/v1/purge/plan", params={"topic": topic}).json()["topics"]
    assert plan["prune_point"] == 5 and plan["blocked_by"] == []
    holding = [g["consumer_group"] for g in plan["pinned_groups"] if g["holds_prune_point"]]
    assert holding == [CDC]

    [view] = purge_and_wait(live.url, [topic])
    assert view.state == "succeeded", view
    admin = KafkaAdmin(kafka_bootstrap)
    try:
        assert admin.offsets([topic])[topic].log_start_offset == 5
    finally:
        admin.close()


def test_a_blocked_topic_names_its_regions_and_the_group(
    live: LiveMetasrv, viewer: httpx.Client
) -> None:
    topic = live.world.blocked_topic
    [plan] = viewer.get("/v1/purge/plan", params={"topic": topic}).json()["topics"]
    # Regions first, then the groups (a client reads either shape from one list).
    assert plan["blocked_by"] == [
        {"region_id": live.world.blocked_region, "reason": "no_stat"},
        {"consumer_group": CDC, "reason": "no_committed_offset"},
        {"consumer_group": SILENT, "reason": "no_committed_offset"},
    ]


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.browser
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is absent")
def test_the_dashboard_shows_the_blocking_group_like_a_blocking_region(
    live: LiveMetasrv, kafka_bootstrap: str
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.api.test_dashboard_browser import CHROMIUM_ARGS

    w = live.world
    commit_offset(kafka_bootstrap, CDC, w.purgeable_topic, 5)
    commit_offset(kafka_bootstrap, SILENT, w.purgeable_topic, 12)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{live.url}/dashboard?refresh=1")
            page.fill("#token", VIEWER_TOKEN)
            page.click("#token-form button")
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)

            blocked = page.locator(f'tr[data-topic="{w.blocked_topic}"]')
            expect(blocked.get_by_test_id("blocked-region")).to_have_text(
                f"region {w.blocked_region}: no_stat"
            )
            expect(blocked.get_by_test_id("blocked-group")).to_have_text(
                [f"consumer group {CDC}: no_committed_offset",
                 f"consumer group {SILENT}: no_committed_offset"]
            )  # fmt: skip
            held = page.locator(f'tr[data-topic="{w.purgeable_topic}"]')
            expect(held.locator('[data-field="prune_point"]')).to_have_text("5")
            expect(held.get_by_test_id("held-by-group")).to_contain_text(
                f"held by consumer group {CDC} (lag {RECORDS_PER_TOPIC - 5})"
            )
        finally:
            browser.close()
