"""The web process: ingest API, Slack and Teams endpoints, preferences, /metrics.

A host FastAPI/Starlette app mounts clarion under its own prefix, with its own middleware:

    from clarion.web import asgi_app
    host.mount("/notify", asgi_app())  # and CLARION_PUBLIC_URL=https://app.example.com/notify
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette


def asgi_app(*, admin: bool = True) -> Starlette:
    """A new clarion ASGI app (the one `clarion web` serves). admin=False leaves out /metrics,
    /docs and /openapi.json, for a host that must not expose them under its prefix."""
    from clarion.web.app import create_app

    return create_app(admin=admin)
