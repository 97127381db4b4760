"""The dashboard in headless Chromium against a live metasrv with real state.

Regions are registered and heartbeating, one topic is blocked, one lost entries to an
outside deletion, and purges have run: the page must show all of it, with the viewer
token typed into its field, and refresh by itself when state changes.

The WAL trend plots are looked at after a simulated datanode wrote to three topics and
purges cut them: a screenshot is taken (kept in the test's tmp dir; copied to
benchmarks/results/dashboard.png when METASRV_SAVE_SCREENSHOT=1) and its plot area must
hold the drawn lines, at a laptop's width and at a narrow one.
"""

from __future__ import annotations

import base64
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from metasrv import wire
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv
from metasrv.model import region_id_of
from metasrv.wire import MetasrvClient
from tests._wait import wait_until
from tests.api._live import (
    DATANODE_TOKEN,
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    World,
    live_metasrv,
    live_settings,
    purge_and_wait,
    serve,
)
from toolbox.simulator import SimDatanode

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
TREND_SAMPLES = 20
"""Samples the trend plots show per topic at least (one every 250 ms)."""
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


# --- the WAL trend plots -------------------------------------------------------------------

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@dataclass(frozen=True)
class Simulated:
    url: str
    topics: tuple[str, ...]
    purges: int
    """Purges that succeeded (each is a dot on each plot)."""


@pytest.fixture(scope="module")
def simulated(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Simulated]:
    """A metasrv sampling every 250 ms; a simulated datanode writes to three topics in six
    rounds, flushing every region, and purges cut topic 0 every round, topic 1 every
    second round and topic 2 once: three saw-tooth lines of different periods."""
    workdir = tmp_path_factory.mktemp("trend-browser")
    prefix = f"tr{uuid.uuid4().hex[:8]}"
    settings = live_settings(
        prefix,
        kafka_bootstrap,
        etcd_endpoint,
        workdir,
        dashboard={"sample_interval": "250ms", "window": "5m"},
    )
    topics = tuple(f"{prefix}_{n}" for n in range(3))
    try:
        with serve(settings) as url, MetasrvClient(url, token=OPERATOR_TOKEN) as operator:
            node = SimDatanode(
                1,
                url,
                DATANODE_TOKEN,
                kafka_bootstrap,
                workdir / "dn",
                heartbeat_interval=0.2,
                flush_threshold_bytes=None,
            )
            try:
                layout = {topics[0]: 2, topics[1]: 2, topics[2]: 1}
                regions = []
                for n, (topic, count) in enumerate(layout.items()):
                    for k in range(count):
                        region_id = region_id_of(3000 + n, k)
                        operator.add_region(region_id, 1, topic)
                        regions.append(node.add_region(region_id, topic))
                node.start()
                succeeded = 0
                for round_ in range(6):
                    writes = {topics[0]: 30 + 15 * round_, topics[1]: 25, topics[2]: 12}
                    futures = [r.write("x" * 200) for r in regions for _ in range(writes[r.topic])]
                    for f in futures:
                        f.result(30)
                    for r in regions:
                        r.flush()
                    wait_until(
                        lambda: all(
                            (stat := operator.region(r.region_id).stat) is not None
                            and stat.flushed_entry_id >= r.flushed_entry_id
                            for r in regions
                        ),
                        "every region's flush reported",
                        interval=0.1,
                    )
                    due = [topics[0]]
                    if round_ % 2 == 1:
                        due.append(topics[1])
                    if round_ == 3:
                        due.append(topics[2])
                    views = operator.wait(operator.purge(due), timeout=30, poll_interval=0.1)
                    assert all(v.state == "succeeded" for v in views), views
                    succeeded += len(views)
                    finished = max(v.finished_at.timestamp() for v in views if v.finished_at)

                def plotted() -> bool:
                    body = wire.decode(operator.raw("GET", "/v1/purge/trend"), wire.WalTrend)
                    return len(body.at) >= TREND_SAMPLES and body.at[-1] > finished

                wait_until(plotted, f"{TREND_SAMPLES} samples, one after the last purge")
                yield Simulated(url, topics, succeeded)
            finally:
                node.close()
    finally:
        kv = EtcdKv(etcd_endpoint, settings.kv.key_prefix)
        try:
            kv.delete_prefix("")
        finally:
            kv.close()
        admin = KafkaAdmin(kafka_bootstrap)
        try:
            admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
        finally:
            admin.close()


def colored_pixels(browser: Any, png: bytes) -> int:
    """Pixels of a PNG that are colour (a drawn line or dot), not the white card, the grey
    grid or the grey axis text: decoded by Chromium on a blank page."""
    page = browser.new_page()
    try:
        src = "data:image/png;base64," + base64.b64encode(png).decode()
        found: int = page.evaluate(
            """async (src) => {
                const img = new Image();
                img.src = src;
                await img.decode();
                const canvas = document.createElement("canvas");
                canvas.width = img.width; canvas.height = img.height;
                const ctx = canvas.getContext("2d");
                ctx.drawImage(img, 0, 0);
                const px = ctx.getImageData(0, 0, img.width, img.height).data;
                let n = 0;
                for (let i = 0; i < px.length; i += 4) {
                    const hi = Math.max(px[i], px[i + 1], px[i + 2]);
                    const lo = Math.min(px[i], px[i + 1], px[i + 2]);
                    if (hi - lo > 60) n++;
                }
                return n;
            }""",
            src,
        )
        return found
    finally:
        page.close()


def test_trend_plots_show_retained_wal_and_purges(simulated: Simulated, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    sim = simulated
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            csp_violations: list[str] = []
            page.on(
                "console",
                lambda m: (
                    csp_violations.append(m.text) if "Content Security Policy" in m.text else None
                ),
            )
            page.goto(f"{sim.url}/dashboard?refresh=1")
            page.fill("#token", VIEWER_TOKEN)
            page.click("#token-form button")
            page.wait_for_selector("#trend[data-loaded=true]", timeout=15_000)
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)

            for plot in ("trend-entries", "trend-bytes"):
                svg = page.get_by_test_id(plot)
                lines = svg.locator("path.series")
                expect(lines).to_have_count(3)
                assert sorted(lines.evaluate_all("ps => ps.map(p => p.dataset.topic)")) == sorted(
                    sim.topics
                )
                # Sampled every 250 ms over the rounds: dozens of points per line.
                assert int(svg.get_attribute("data-points") or 0) >= 3 * TREND_SAMPLES
                dots = svg.locator("circle.purge")
                expect(dots).to_have_count(sim.purges)
                tip = dots.first.locator("title").text_content() or ""
                assert "freed" in tip and "entries" in tip and "procedure" in tip, tip
            expect(page.get_by_test_id("trend-summary")).to_contain_text(
                f"{sim.purges} purge(s) in the window"
            )
            for topic in sim.topics:
                expect(page.get_by_test_id("trend-legend")).to_contain_text(topic)

            # A laptop's width: the two plots side by side, each wide enough to read.
            boxes = [
                page.get_by_test_id(p).bounding_box() for p in ("trend-entries", "trend-bytes")
            ]
            assert all(b is not None for b in boxes)
            left, right = boxes[0], boxes[1]
            assert left is not None and right is not None
            assert abs(left["y"] - right["y"]) < 1 and left["width"] >= 500, boxes

            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            plots = page.locator("#trend .plots").screenshot(path=str(tmp_path / "trend.png"))
            # The plot area holds coloured lines and dots, not only the card and the grid.
            assert colored_pixels(browser, plots) > 2_000
            if os.environ.get("METASRV_SAVE_SCREENSHOT") == "1":
                RESULTS.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, RESULTS / "dashboard.png")
            # The check sees the lines: with them hidden, the same area is grey on white.
            hidden = page.add_style_tag(content=".series, .purge, .cut { display: none; }")
            bare = page.locator("#trend .plots").screenshot()
            assert colored_pixels(browser, bare) < 200
            hidden.evaluate("node => node.remove()")

            # Narrower: the plots stack and stay inside the window, lines still drawn.
            page.set_viewport_size({"width": 700, "height": 900})
            page.wait_for_timeout(400)  # the page redraws after a resize pause
            top, bottom = (
                page.get_by_test_id(p).bounding_box() for p in ("trend-entries", "trend-bytes")
            )
            assert top is not None and bottom is not None
            assert bottom["y"] >= top["y"] + top["height"], (top, bottom)
            assert top["x"] + top["width"] <= 700
            narrow = page.locator("#trend .plots").screenshot(path=str(tmp_path / "narrow.png"))
            assert colored_pixels(browser, narrow) > 1_000
            assert csp_violations == [], csp_violations
        finally:
            browser.close()
