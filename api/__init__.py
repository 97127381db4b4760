"""The HTTP API (DESIGN §5): FastAPI app, routers, models, auth and error mapping."""

from api.app import create_app

__all__ = ["create_app"]
