"""/healthz (the process answers) and /readyz (it can do its work: database, schema, broker,
catalog), for load balancers and orchestrators.

    GET /readyz -> 200 {"status": "ready", "checks": {"database": {"ok": true}, ...}}
                   503 {"status": "not_ready", "checks": {"broker": {"ok": false,
                        "reason": "Error 111 connecting to 127.0.0.1:1. Connection refused."}, ...}}

Each check runs in a thread with its own short timeout (CHECK_SECONDS, and the driver's connect
timeout below it), all at once, so /readyz answers within about CHECK_SECONDS whatever hangs. A
failing check's reason is the first line of its error, never a traceback; URLs are not echoed
(a driver's message names host and database, not the password).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import lru_cache

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from clarion import settings
from clarion.db.engine import normalise_url, schema_problem, timeout_args
from clarion.db.schema import SCHEMA_REVISION

CHECK_SECONDS = 2.0  # each check's budget; they run concurrently
CONNECT_SECONDS = 1  # the drivers' connect timeout (whole seconds for libpq), inside the budget


@lru_cache(maxsize=8)
def _probe_engine(url: str) -> Engine:
    """A pool-less engine with short connect and statement timeouts (one per database URL)."""
    return create_engine(
        normalise_url(url),
        poolclass=NullPool,
        connect_args=timeout_args(CONNECT_SECONDS, CHECK_SECONDS),
    )


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc  # SQLAlchemy's wrapper: the driver's own words
    lines = str(cause).strip().splitlines() or [type(cause).__name__]
    return lines[0][:300]


def database() -> dict[str, str | None]:
    """The database answers, and its schema is at this code's revision: {check: reason|None}."""
    try:
        url = settings.get().urls()[0]
        with _probe_engine(url).connect() as conn:
            conn.execute(text("SELECT 1"))
            problem = schema_problem(conn)
    except Exception as exc:  # any failure to reach it is the answer, not an error of ours
        reason = _first_line(exc)
        return {"database": reason, "schema": f"unknown: {reason}"}
    if problem is not None:
        problem = f"{problem}; this code needs revision {SCHEMA_REVISION}: run `clarion migrate`"
    return {"database": None, "schema": problem}


def broker() -> dict[str, str | None]:
    """The broker answers (Redis PING; another transport: a connection opened)."""
    try:
        url = settings.get().urls()[2]
        if url.startswith(("redis://", "rediss://", "unix://")):
            import redis

            client = redis.Redis.from_url(
                url, socket_connect_timeout=CONNECT_SECONDS, socket_timeout=CONNECT_SECONDS
            )
            try:
                client.ping()
            finally:
                client.close()
        else:
            from kombu import Connection

            from clarion.sentinel import transport_options

            options = transport_options(url, settings.get().sentinel_master)
            with Connection(
                url, connect_timeout=CONNECT_SECONDS, transport_options=options
            ) as conn:
                conn.ensure_connection(max_retries=1, timeout=CONNECT_SECONDS)
    except Exception as exc:
        return {"broker": _first_line(exc)}
    return {"broker": None}


def catalog() -> dict[str, str | None]:
    """The configured catalog loads (runtime's per-process copy, what this process serves with)."""
    from clarion.tasks import runtime

    try:
        runtime.catalog()
    except Exception as exc:
        return {"catalog": _first_line(exc)}
    return {"catalog": None}


CHECKS: tuple[tuple[tuple[str, ...], Callable[[], dict[str, str | None]]], ...] = (
    (("database", "schema"), database),
    (("broker",), broker),
    (("catalog",), catalog),
)


async def _run(names: tuple[str, ...], check: Callable[[], dict[str, str | None]]) -> dict:
    try:
        return await asyncio.wait_for(run_in_threadpool(check), CHECK_SECONDS)
    except TimeoutError:
        return dict.fromkeys(names, f"no answer within {CHECK_SECONDS:g} s")


async def readiness() -> tuple[bool, dict[str, dict[str, object]]]:
    """(ready, {dependency: {"ok": bool, "reason"?: str}}) with every check run concurrently."""
    found: dict[str, str | None] = {}
    for part in await asyncio.gather(*(_run(names, check) for names, check in CHECKS)):
        found.update(part)
    checks: dict[str, dict[str, object]] = {
        name: {"ok": True} if reason is None else {"ok": False, "reason": reason}
        for name, reason in found.items()
    }
    return all(reason is None for reason in found.values()), checks


async def health(request: Request) -> JSONResponse:
    """Alive: the process answers HTTP (nothing else is asked)."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> JSONResponse:
    ok, checks = await readiness()
    body = {"status": "ready" if ok else "not_ready", "checks": checks}
    return JSONResponse(body, status_code=200 if ok else 503, headers={"Cache-Control": "no-store"})


def routes() -> list[Route]:
    return [Route("/healthz", health), Route("/readyz", ready)]
