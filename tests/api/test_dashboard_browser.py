"""The dashboard in headless Chromium against a live metasrv with real state.

Regions are registered and heartbeating, one topic is blocked, one lost entries to an
outside deletion, and purges have run: the page must show all of it, with the viewer
token typed into its field, and refresh by itself when state changes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metasrv.model import region_id_of
from metasrv.wire import MetasrvClient
from tests.api._live import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    World,
    live_metasrv,
    purge_and_wait,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

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
) -> Iterator[tuple[str, World]]:
    workdir = tmp_path_factory.mktemp("dashboard")
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir) as metasrv:
        url, world = metasrv.url, metasrv.world
        views = purge_and_wait(url, [world.purgeable_topic, world.loss_topic])
        assert sorted(v.state for v in views) == ["failed", "succeeded"]
        yield url, world


def test_page_is_served_without_a_token(served: tuple[str, World]) -> None:
    url, _ = served
    response = httpx.get(f"{url}/dashboard")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    # Offline machines: nothing may be fetched from elsewhere.
    assert "http://" not in response.text and "https://" not in response.text


def test_dashboard_renders_live_state(served: tuple[str, World]) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, w = served
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            failed_requests: list[str] = []
            # A navigation aborts the page's in-flight refresh (net::ERR_ABORTED); that is
            # the browser's doing, not a failed request.
            page.on(
                "requestfailed",
                lambda r: (
                    None
                    if r.failure == "net::ERR_ABORTED"
                    else failed_requests.append(f"{r.url}: {r.failure}")
                ),
            )

            # The page's Content-Security-Policy must not block the page itself.
            csp_violations: list[str] = []
            page.on(
                "console",
                lambda m: (
                    csp_violations.append(m.text) if "Content Security Policy" in m.text else None
                ),
            )

            # Without a token the data calls are refused and the page says so.
            page.goto(f"{url}/dashboard?refresh=1")
            expect(page.get_by_test_id("error")).to_contain_text("Not authorized")

            # Typing the viewer token in the field stores it and loads the data.
            page.fill("#token", VIEWER_TOKEN)
            page.click("#token-form button")
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
            expect(page.get_by_test_id("error")).to_be_hidden()
            expect(page.get_by_test_id("leader")).to_contain_text(url.removeprefix("http://"))

            purged = page.locator(f'tr[data-topic="{w.purgeable_topic}"]')
            expect(purged.locator('[data-field="pruned_entry_id"]')).to_have_text(
                str(w.prune_point)
            )
            expect(purged.locator('[data-field="prune_point"]')).to_have_text(str(w.prune_point))
            expect(purged.locator('[data-field="log_start_offset"]')).to_have_text(
                str(w.prune_point)
            )
            expect(purged.locator('[data-field="high_watermark"]')).to_have_text("20")
            expect(purged.get_by_test_id("bar")).to_be_visible()

            blocked = page.locator(f'tr[data-topic="{w.blocked_topic}"]')
            expect(blocked.get_by_test_id("blocked-region")).to_have_text(
                f"region {w.blocked_region}: no_stat"
            )
            lost = page.locator(f'tr[data-topic="{w.loss_topic}"]')
            expect(lost.locator('[data-field="why"]')).to_contain_text("WAL DATA LOSS")
            expect(page.get_by_test_id("loss-banner")).to_contain_text(w.loss_topic)

            failed = page.get_by_test_id("procedures").locator("tbody tr")
            expect(failed).to_have_count(1)
            expect(failed).to_contain_text("failed")
            expect(failed).to_contain_text(w.loss_topic)

            history = page.get_by_test_id("history").locator("tbody tr")
            expect(history).to_have_count(1)
            expect(history.locator('[data-field="prune_point"]')).to_have_text(str(w.prune_point))
            expect(history.locator('[data-field="entries_deleted"]')).to_have_text(
                str(w.prune_point)
            )
            events = page.get_by_test_id("events").locator("tbody tr")
            expect(events).to_have_count(1)
            expect(events).to_contain_text(str(w.loss_region))

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            # A reload keeps the token (localStorage), and the page refreshes by itself:
            # a region registered behind its back blocks the purged topic without a reload.
            page.goto(f"{url}/dashboard?refresh=1")
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
            newcomer = region_id_of(2048, 5)
            with MetasrvClient(url, token=OPERATOR_TOKEN) as operator:
                operator.add_region(newcomer, 9, w.purgeable_topic)
            expect(purged.get_by_test_id("blocked-region")).to_have_text(
                f"region {newcomer}: no_stat", timeout=15_000
            )

            # A token in the URL is refused (it would stay in history and proxy logs).
            other = browser.new_context().new_page()
            refused = other.goto(f"{url}/dashboard?token={VIEWER_TOKEN}")
            assert refused is not None and refused.status == 400
            assert failed_requests == [], failed_requests
            assert csp_violations == [], csp_violations
        finally:
            browser.close()
