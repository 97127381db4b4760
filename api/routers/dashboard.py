"""`GET /dashboard`: the self-contained operator page (DESIGN §5), `GET /v1/purge/trend`,
the retained-WAL history its plots draw (sampled by the leader: procedures/wal_purge/_trend.py),
and `GET /v1/purge/archived`, each topic's archived range it shows beside the log start (the
leader's last listing of the archive, made by a purge: procedures/wal_purge/_archive.py).

The page itself needs no token: it holds no data. Its JavaScript calls the read API with
the viewer token the user typed, kept in the page's own localStorage and sent only in the
Authorization header. A token in the URL (`?token=`) is refused with 400: URLs end up in
browser history, proxy logs and Referer headers.

The page is served with a Content-Security-Policy that runs only its own inline script
(by hash) and talks only to this origin, and may not be framed (clickjacking).
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from api import answers
from api.auth import RequireViewer
from api.deps import LeaderDep
from api.errors import error_response
from api.wire_http import ERROR_RESPONSES, TopicQuery, answer, gives
from metasrv import wire
from metasrv.settings import ArchiveSettings
from procedures.wal_purge import LISTED

router = APIRouter(tags=["dashboard"])

_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


@cache
def dashboard_html() -> str:
    """The page's HTML, read once from the package data."""
    return (resources.files("api.static") / "dashboard.html").read_text(encoding="utf-8")


@cache
def security_headers() -> dict[str, str]:
    """The dashboard's response headers; the CSP allows exactly the page's inline scripts."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in _SCRIPT.findall(dashboard_html())
    )
    policy = "; ".join(
        [
            "default-src 'none'",
            f"script-src {hashes}",
            # The page positions its offset bars with style attributes.
            "style-src 'unsafe-inline'",
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return {
        "Content-Security-Policy": policy,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


@router.get(
    "/dashboard",
    response_class=HTMLResponse,
    summary="Operator dashboard (HTML; no auth: its data calls carry the token)",
    responses={
        200: {"content": {"text/html": {}}, "description": "The dashboard page."},
        400: gives(wire.ErrorBody, "A token was passed in the URL."),
    },
)
async def dashboard(request: Request) -> Response:
    """Serve the dashboard page."""
    if "token" in request.query_params:
        return error_response(
            400,
            "token_in_url",
            "tokens are not accepted in URLs; type the viewer token into the page's field",
            headers={"Referrer-Policy": "no-referrer"},
        )
    return HTMLResponse(dashboard_html(), headers=security_headers())


@router.get(
    "/v1/purge/trend",
    dependencies=[RequireViewer],
    summary="Retained WAL per topic over the last window, and the purges that cut it",
    response_class=Response,
    responses={
        200: gives(wire.WalTrend, "Sampled by the leader every `[dashboard] sample_interval`."),
        **ERROR_RESPONSES,
    },
)
async def wal_trend(
    runtime: LeaderDep,
    topic: TopicQuery = None,
    top: Annotated[int | None, Query(ge=1, le=10_000, description="Only the N largest.")] = None,
) -> Response:
    """Viewer token. From the leader's memory: a new leader starts with no samples (the
    purges of the window come back from the history). A topic never sampled has no series."""
    return answer(answers.wal_trend(runtime.wal_trend, topic=topic, top=top))


def archived_list(settings: ArchiveSettings) -> wire.ArchivedList:
    """What the leader's last listing of each topic's archive found (`LISTED`), by topic."""
    spans = LISTED.spans(settings) if settings.enabled else {}
    return wire.ArchivedList(
        enabled=settings.enabled,
        topics=[
            wire.ArchivedTopic(
                topic=topic,
                first_entry_id=span.first_entry_id,
                end=span.end,
                gap=span.gap,
                objects=span.objects,
                listed_at=span.listed_at,
            )
            for topic, span in sorted(spans.items())
        ],
    )


@router.get(
    "/v1/purge/archived",
    dependencies=[RequireViewer],
    summary="Each topic's archived WAL range, as the leader's purges last listed it",
    response_class=Response,
    responses={
        200: gives(wire.ArchivedList, "From memory: no object store call per request."),
        **ERROR_RESPONSES,
    },
)
async def archived_ranges(runtime: LeaderDep) -> Response:
    """Viewer token. A topic appears once a purge (or a replay-start below the log start, or
    a data-loss report) listed its archive on this leader."""
    return answer(archived_list(runtime.settings.wal.archive))
