"""The ASGI app (`clarion web`, or `uvicorn web.app:app`): mounts each surface's routes.

`app` is built on first use (module `__getattr__`), so importing this module stays cheap (the CLI
imports it for check_bind) and settings are read when the app is served, not when it is imported."""

from __future__ import annotations

import ipaddress
from importlib import import_module

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from clarion import extras
from clarion.errors import ConfigurationError


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    """This host's metrics (every worker process's, summed) and the ledger's gauges."""
    from starlette.concurrency import run_in_threadpool

    from clarion import metrics as collected

    body, content_type = await run_in_threadpool(collected.exposition)
    return Response(body, media_type=content_type)


def create_app() -> Starlette:
    routes = [Route("/healthz", health), Route("/metrics", metrics)]
    from clarion.web import api, email, inbox, preferences

    # A provider's doors are served when its SDK (its extra) is installed.
    for extra, door in (("slack", "slack"), ("teams", "teams")):
        if extras.installed(extra):
            routes += import_module(f"clarion.web.{door}").routes()
    routes += email.routes() + inbox.routes()
    if extras.installed("twilio"):
        routes += import_module("clarion.web.sms").routes()
    routes += preferences.routes()
    return api.application(routes)  # FastAPI, a Starlette: the /v1 API, /openapi.json and /docs


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
