"""The dashboard's "Prune events" table in headless Chromium, against a live metasrv whose
purges deleted, were skipped (blocked) and failed on WAL data loss."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from metasrv import wire
from tests.api._live import VIEWER_TOKEN, World, live_metasrv, purge_and_wait
from tests.api.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None,
        reason=f"{CHROMIUM} is absent (deploy/bootstrap.sh --test installs it)",
    ),
]


@pytest.fixture(scope="module")
def served(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, World, dict[str, wire.Procedure]]]:
    workdir = tmp_path_factory.mktemp("dashboard-events")
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir) as metasrv:
        w = metasrv.world
        views = purge_and_wait(metasrv.url, [w.purgeable_topic, w.blocked_topic, w.loss_topic])
        yield metasrv.url, w, {v.topic or "": v for v in views}


def test_prune_events_are_shown(served: tuple[str, World, dict[str, wire.Procedure]]) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, w, by_topic = served
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/dashboard?refresh=1")
            page.fill("#token", VIEWER_TOKEN)
            page.click("#token-form button")
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)

            rows = page.get_by_test_id("prune-events").locator("tbody tr")
            expect(rows).to_have_count(7)  # 3 started, deleted, skipped, data loss, failed
            deleted = rows.and_(page.locator('tr[data-kind="purge_deleted"]'))
            expect(deleted).to_have_attribute("data-procedure", by_topic[w.purgeable_topic].id)
            expect(deleted.locator('[data-field="target"]')).to_have_text(str(w.prune_point))
            expect(deleted.locator('[data-field="log_start"]')).to_have_text(f"0 → {w.prune_point}")
            expect(deleted.locator('[data-field="high_watermark"]')).to_have_text("20")
            expect(deleted.locator(".state")).to_have_class("state succeeded")
            skipped = page.locator('tr[data-kind="purge_skipped"]')
            expect(skipped.locator('[data-field="message"]')).to_have_text(
                f"blocked by {w.blocked_region} (no_stat)"
            )
            for kind in ("purge_failed", "wal_data_loss"):
                row = page.locator(f'tr[data-kind="{kind}"]')
                expect(row).to_contain_text(w.loss_topic)
                expect(row.locator(".state")).to_have_class("state failed")
            expect(page.locator('tr[data-kind="purge_started"]')).to_have_count(3)
            # Every cell fits a laptop's width: the table does not overflow its section.
            section_width = page.evaluate(
                "document.getElementById('prune-events').parentElement.clientWidth"
            )
            table_width = page.evaluate("document.getElementById('prune-events').scrollWidth")
            assert table_width <= section_width, (table_width, section_width)
        finally:
            browser.close()
