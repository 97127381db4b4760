"""`GET /v1/reconcile/latest` over a real SQLite history database (the router alone)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, create_engine

import migrations
from api.auth import Authenticator
from api.errors import install_error_handlers
from api.routers import reconcile as reconcile_router
from metasrv.reconcile import Finding, FindingKind, RunRecord, Severity, save_run
from metasrv.settings import AuthSettings

VIEWER = {"Authorization": "Bearer v"}


@pytest.fixture
def history(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    migrations.upgrade(url)
    engine = create_engine(url)
    yield engine
    engine.dispose()


class Client:
    """Blocking calls into the app through httpx's ASGI transport (no server, no lifespan)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return await c.get(url, headers=headers)

        return asyncio.run(call())


@pytest.fixture
def client(history: Engine) -> Client:
    app = FastAPI()
    app.state.runtime = SimpleNamespace(history=history)
    app.state.auth = Authenticator(AuthSettings(viewer_tokens=["v"], operator_tokens=["o"]))
    install_error_handlers(app)
    app.include_router(reconcile_router.router)
    return Client(app)


def _save(engine: Engine, run_id: str, at: datetime, findings: list[Finding], **kw: int) -> None:
    counts: dict[str, dict[str, int]] = {}
    for f in findings:
        by = counts.setdefault(f.kind.value, {})
        by[f.severity.value] = by.get(f.severity.value, 0) + 1
    save_run(
        engine,
        RunRecord(
            run_id=run_id,
            started_at=at - timedelta(seconds=5),
            finished_at=at,
            status="succeeded",
            master="local[2]",
            applied=False,
            kv_revision=7,
            counts=counts,
            findings_total=len(findings),
            out_dir="/tmp/x",
            summary={"notes": []},
        ),
        findings,
        actions={(FindingKind.UNMAPPED_REGION.value, "t_1", 8): "registered"},
        limit=kw.get("limit", 1000),
        keep_runs=kw.get("keep_runs", 10),
    )


FINDINGS = [
    Finding(
        FindingKind.TOPIC_MISMATCH, Severity.CRITICAL, "t_1", 4, "m", {"reported_topic": "t_2"}
    ),
    Finding(FindingKind.UNMAPPED_REGION, Severity.WARNING, "t_1", 8, "u", {"node_id": 3}),
    Finding(FindingKind.ORPHAN_TOPIC, Severity.INFO, "t_9", None, "o", {}),
]


def test_no_run_yet_is_404(client: Client) -> None:
    r = client.get("/v1/reconcile/latest", headers=VIEWER)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_latest_run_with_filters_and_paging(client: Client, history: Engine) -> None:
    now = datetime.now(UTC)
    _save(history, "old", now - timedelta(hours=1), FINDINGS[:1])
    _save(history, "new", now, FINDINGS)
    body = client.get("/v1/reconcile/latest", headers=VIEWER).json()
    assert body["run"]["run_id"] == "new"
    assert body["run"]["counts"]["topic_mismatch"] == {"critical": 1}
    assert body["matched"] == 3
    assert [(f["kind"], f["region_id"], f["action"]) for f in body["findings"]] == [
        ("topic_mismatch", 4, None),
        ("unmapped_region", 8, "registered"),
        ("orphan_topic", None, None),
    ]
    assert body["findings"][0]["evidence"] == {"reported_topic": "t_2"}
    warn = client.get("/v1/reconcile/latest?severity=warning", headers=VIEWER).json()
    assert [f["region_id"] for f in warn["findings"]] == [8]
    page = client.get("/v1/reconcile/latest?limit=1&offset=2", headers=VIEWER).json()
    assert [f["kind"] for f in page["findings"]] == ["orphan_topic"]
    assert page["matched"] == 3


def test_bad_requests_are_4xx(client: Client, history: Engine) -> None:
    _save(history, "r", datetime.now(UTC), FINDINGS)
    assert client.get("/v1/reconcile/latest").status_code == 401
    assert (
        client.get("/v1/reconcile/latest", headers={"Authorization": "Bearer x"}).status_code == 401
    )
    for query in ("kind=nope", "severity=loud", "limit=0", "limit=5000", "offset=-1"):
        r = client.get(f"/v1/reconcile/latest?{query}", headers=VIEWER)
        assert r.status_code == 422, query


def test_old_runs_and_findings_beyond_the_limit_are_not_kept(history: Engine) -> None:
    now = datetime.now(UTC)
    for i in range(4):
        _save(history, f"r{i}", now + timedelta(seconds=i), FINDINGS, limit=2, keep_runs=2)
    with history.connect() as conn:
        runs = conn.exec_driver_sql(
            "SELECT run_id, findings_stored, findings_total FROM reconcile_runs ORDER BY run_id"
        ).all()
        kept = conn.exec_driver_sql("SELECT DISTINCT run_id FROM reconcile_findings").all()
    assert [tuple(r) for r in runs] == [("r2", 2, 3), ("r3", 2, 3)]
    assert sorted(r[0] for r in kept) == ["r2", "r3"]
