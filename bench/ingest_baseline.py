"""The baseline of bench/ingest.py: the least an HTTP ingest endpoint on clarion's stack can do.

Starlette under uvicorn (the same server `clarion web` runs), psycopg 3, a pool of eight
connections per server process, and per request one `INSERT … ON CONFLICT DO NOTHING` committed
on its own (autocommit) before the answer: durable, like clarion's 202. No authentication, no
validation, no broker. Run by bench/ingest.py as `uvicorn bench.ingest_baseline:app`; the database
is BENCH_BASELINE_URL, the table `bench_events` (made by bench/ingest.py).
"""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

POOL_SIZE = 8
_INSERT = "INSERT INTO bench_events (event_id, body) VALUES (%s, %s) ON CONFLICT DO NOTHING"


class Pool:
    """A fixed set of autocommit connections, opened on first use."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.opened = url, size, 0
        self.idle: queue.SimpleQueue[psycopg.Connection] = queue.SimpleQueue()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        try:
            conn = self.idle.get_nowait()
        except queue.Empty:
            if self.opened < self.size:
                self.opened += 1
                conn = psycopg.connect(self.url, autocommit=True)
            else:
                conn = self.idle.get()
        try:
            yield conn
        finally:
            self.idle.put(conn)


POOL = Pool(os.environ.get("BENCH_BASELINE_URL", ""), POOL_SIZE)


def _insert(event_id: str, body: str) -> None:
    with POOL.connection() as conn:
        conn.execute(_INSERT, (event_id, body))


async def post_event(request: Request) -> Response:
    raw = await request.body()
    event = json.loads(raw)
    await run_in_threadpool(_insert, str(event["event_id"]), raw.decode())
    return Response(b'{"new":true}', status_code=202, media_type="application/json")


app = Starlette(routes=[Route("/v1/events", post_event, methods=["POST"])])
