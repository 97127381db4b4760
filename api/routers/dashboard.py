"""`GET /dashboard`: the self-contained operator page (DESIGN §5).

The page itself needs no token: it holds no data. Its JavaScript calls the read API with
the viewer token the user typed (kept in localStorage) or passed as `?token=`.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["dashboard"])


@cache
def dashboard_html() -> str:
    """The page's HTML, read once from the package data."""
    return (resources.files("api.static") / "dashboard.html").read_text(encoding="utf-8")


@router.get(
    "/dashboard",
    response_class=HTMLResponse,
    summary="Operator dashboard (HTML; no auth: its data calls carry the token)",
    responses={200: {"content": {"text/html": {}}, "description": "The dashboard page."}},
)
async def dashboard() -> HTMLResponse:
    """Serve the dashboard page."""
    return HTMLResponse(dashboard_html(), headers={"Cache-Control": "no-cache"})
