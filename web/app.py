"""The ASGI app (`clarion web`, `uvicorn clarion.web.app:app`, or mounted by a host app under a
prefix: `clarion.web.asgi_app()`): each surface's routes in one app.

`app` is built on first use (module `__getattr__`), so importing this module stays cheap (the CLI
imports it for check_bind) and settings are read when the app is served, not when it is imported."""

from __future__ import annotations

import ipaddress
import logging
from importlib import import_module
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from clarion import extras
from clarion.errors import ClarionError, ConfigurationError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fastapi import FastAPI

ADMIN_PATHS = ("/metrics", "/docs", "/openapi.json")  # off the public listener with --admin-bind


async def metrics(request: Request) -> Response:
    """This host's metrics (every worker process's, summed) and the ledger's gauges."""
    from starlette.concurrency import run_in_threadpool

    from clarion.web import scrape

    body, content_type = await run_in_threadpool(scrape.exposition)
    return Response(body, media_type=content_type)


def _surfaces() -> list[BaseRoute]:
    from clarion.web import activity, email, escalation_ack, inbox, preferences, ready

    routes: list[BaseRoute] = [*ready.routes()]
    # A provider's doors are served when its SDK (its extra) is installed.
    for extra, door in (("slack", "slack"), ("teams", "teams")):
        if extras.installed(extra):
            routes += import_module(f"clarion.web.{door}").routes()
    routes += email.routes() + inbox.routes()
    if extras.installed("twilio"):
        routes += import_module("clarion.web.sms").routes()
    return routes + preferences.routes() + escalation_ack.routes() + activity.routes()


def create_app(*, admin: bool = True) -> FastAPI:
    """clarion's whole HTTP surface as one ASGI app: what `clarion web` serves, and what a host
    app mounts (`host.mount("/notify", clarion.web.asgi_app())`). admin=False leaves out /metrics,
    /docs and /openapi.json (404), for a public listener whose admin routes are served elsewhere."""
    from clarion import metrics as counted
    from clarion.web import api

    counted.check()  # receipts counted here must reach the scrape too: refuse to serve otherwise
    from clarion.tasks import runtime

    try:  # loaded, and named in the log (tasks/catalogs.py), before the first request
        runtime.catalog()
    except ClarionError as exc:  # served anyway: the routes that need a catalog say so
        log.error("the catalog does not load: %s", exc, extra={"action": "catalog_broken"})
    routes = _surfaces() + ([Route("/metrics", metrics)] if admin else [])
    return api.application(routes, docs=admin)  # FastAPI, a Starlette: /v1, /openapi.json, /docs


def public_app() -> Starlette:
    """`clarion web --admin-bind`'s public listener: everything but the admin routes."""
    return create_app(admin=False)


def admin_app() -> Starlette:
    """`clarion web --admin-bind`'s second listener: /metrics, /docs and /openapi.json (of the
    whole API), /healthz and /readyz; nothing else."""
    from fastapi.openapi.docs import get_swagger_ui_html

    from clarion.web import ready

    whole = create_app()

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(whole.openapi())

    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="clarion - Swagger UI")

    routes = [Route("/metrics", metrics), Route("/openapi.json", openapi), Route("/docs", docs)]
    # the whole app's error handlers: an admin route answers exactly as it would on the public one
    return Starlette(routes=routes + ready.routes(), exception_handlers=whole.exception_handlers)


def __getattr__(name: str) -> Starlette:
    """`web.app.app`: create_app() once per process, kept as a plain attribute from then on."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = globals()["app"] = create_app()
    return built


def is_loopback(host: str) -> bool:
    """Is `host` an address only this machine can reach? ("0.0.0.0" and "::" are every address.)"""
    if host.strip().lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_bind(
    host: str, teams_app_id: str | None, *, allow_insecure_teams: bool = False
) -> str | None:
    """Before `clarion web` binds `host`: the warning to print in Teams local mode (None otherwise).
    Raises ConfigurationError for local mode on a non-loopback host unless explicitly allowed: an
    unauthenticated Teams endpoint lets anyone who reaches it act as any Teams user."""
    if not teams_app_id or not extras.installed("teams"):  # no Teams door is served
        return None
    from clarion.adapters.teams import local_mode

    if not local_mode(teams_app_id):
        return None
    from clarion.web.teams import LOCAL_MODE_WARNING

    if not is_loopback(host) and not allow_insecure_teams:
        raise ConfigurationError(
            f"refusing to serve Teams without authentication on {host!r}: "
            "CLARION_TEAMS_APP_ID=none is for local development; bind a loopback "
            "address, set a real app id, or pass --allow-insecure-teams"
        )
    return f"clarion: WARNING: {LOCAL_MODE_WARNING}"
