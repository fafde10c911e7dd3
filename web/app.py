"""The ASGI app (`clarion web`, or `uvicorn web.app:app`): mounts each surface's routes."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def create_app() -> Starlette:
    routes = [Route("/healthz", health)]
    from web import slack, teams

    routes += slack.routes() + teams.routes()
    return Starlette(routes=routes)
