"""Shared commits on the event loop: many requests' rows in one statement, with no thread between
the request and its database.

`LoopCommit.submit_rows(payload)` (awaited on a web server's event loop) hands `payload` to
`batch(connection, payloads)` with every other payload waiting, on one of `connections`
auto-committing psycopg AsyncConnections, and returns this payload's outcome once the statement
(its own transaction, hence durable) returned: as db/group_commit.py's `one_statement` path, but
the loop itself awaits the database. A request's answer then waits for no hand-off to a writer
thread and back, nor for that thread to get the GIL from the loop (at half the baseline's rate in
bench/ingest.py, that wait was most of a request's p95).

Groups form as they do with writer threads: a payload starts a flush when fewer than
`connections` run, and a flush takes everything waiting (up to `max_units`) each time it goes
round, so while the connections are busy the next group gathers. `batch` must write with its
first statement only (later statements only read); each payload's outcome is a result or the
exception for that caller alone. If `batch` raises, each payload of the group is written again on
its own, so one bad payload fails only its caller (a deadlock or serialization failure lost to
another writer is retried the same way). A lost connection fails the group that was on it (as a
failed COMMIT would) and is replaced for the next one; a connection idle for `ping_idle` seconds
is pinged before use. `committed(pairs)`, if given, is called once per group with (payload,
result) of each payload written, after their callers were answered; it must not raise.

Connections belong to one event loop: a payload submitted on another loop (a test client's own)
starts afresh there, and the first loop's connections are closed. Settings that change the
database (a test's own) do the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import psycopg

from clarion import settings
from clarion.db import arrays
from clarion.db.engine import driver_args, engine, normalise_url, pooled_transactions

log = logging.getLogger(__name__)
P = TypeVar("P")
R = TypeVar("R")
PING_IDLE = 1.0
Batch = Callable[
    [psycopg.AsyncConnection[Any], Sequence[P]], Awaitable[Sequence[R | BaseException]]
]


@dataclass(eq=False)
class _Loop(Generic[P]):
    """What one event loop holds: its connections and the payloads waiting."""

    loop: asyncio.AbstractEventLoop
    target: tuple[str, str, bool]  # (url, schema, pooled): the database these connections reach
    waiting: list[tuple[P, asyncio.Future[Any]]] = field(default_factory=list)
    idle: list[tuple[psycopg.AsyncConnection[Any], float]] = field(default_factory=list)
    flushing: int = 0
    flushes: set[asyncio.Task[None]] = field(default_factory=set)

    def close(self) -> None:
        """Close the idle connections without the loop (it may be closed already)."""
        for conn, _ in self.idle:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
        self.idle.clear()


class LoopCommit(Generic[P, R]):
    def __init__(
        self,
        batch: Batch[P, R],
        *,
        connections: int = 4,
        max_units: int = 64,
        ping_idle: float = PING_IDLE,
        committed: Callable[[list[tuple[P, R]]], None] | None = None,
    ) -> None:
        self.batch = batch
        self.connections = connections
        self.max_units = max_units
        self.ping_idle = ping_idle
        self.committed = committed
        self._here: _Loop[P] | None = None

    async def submit_rows(self, payload: P) -> R:
        """`payload`'s outcome once the statement that wrote it returned."""
        here = self._state()
        answer: asyncio.Future[R] = here.loop.create_future()
        here.waiting.append((payload, answer))
        if here.flushing < self.connections:
            here.flushing += 1
            task = here.loop.create_task(self._flush(here))
            here.flushes.add(task)
            task.add_done_callback(here.flushes.discard)
        return await answer

    def _state(self) -> _Loop[P]:
        loop = asyncio.get_running_loop()
        s = settings.get()
        target = (normalise_url(s.urls()[0]), s.schema, pooled_transactions())
        here = self._here
        if here is None or here.loop is not loop or here.target != target:
            if here is not None:
                here.close()
            here = self._here = _Loop(loop, target)
        return here

    async def _flush(self, here: _Loop[P]) -> None:
        try:
            while here.waiting:
                group = here.waiting[: self.max_units]
                del here.waiting[: self.max_units]
                try:
                    await self._write(here, group)
                except Exception as exc:  # a bug: its callers hear of it, the next group goes
                    log.exception("a group's write failed", extra={"action": "loop_commit_failed"})
                    _fail(group, exc)
                except BaseException:  # the loop shutting down: nobody waits forever
                    _fail(group, RuntimeError("the writer stopped"))
                    raise
        finally:
            here.flushing -= 1

    async def _write(self, here: _Loop[P], group: list[tuple[P, asyncio.Future[Any]]]) -> None:
        payloads = [payload for payload, _ in group]
        try:
            conn = await self._connection(here)
        except Exception as exc:  # the database cannot be reached: this group fails
            outcomes: Sequence[Any] = [exc] * len(group)
        else:
            outcomes = await self._outcomes(conn, payloads)
            if conn.closed or conn.broken:
                await _close(conn)
            else:
                here.idle.append((conn, time.monotonic()))
        done: list[tuple[P, R]] = []
        for (payload, answer), outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not answer.done():
                    answer.set_exception(outcome)
            else:
                done.append((payload, outcome))
                if not answer.done():
                    answer.set_result(outcome)
        if done and self.committed is not None:
            try:
                self.committed(done)
            except Exception:  # it must not raise; if it does, the next group still goes
                log.exception("after a group's commit", extra={"action": "loop_commit_failed"})

    async def _outcomes(
        self, conn: psycopg.AsyncConnection[Any], payloads: list[P]
    ) -> Sequence[R | BaseException]:
        try:
            return await self.batch(conn, payloads)
        except Exception as exc:
            if conn.closed or conn.broken or len(payloads) == 1:
                return [exc] * len(payloads)
        outcomes: list[R | BaseException] = []
        for payload in payloads:  # one bad payload fails only its caller
            try:
                outcomes.extend(await self.batch(conn, [payload]))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    async def _connection(self, here: _Loop[P]) -> psycopg.AsyncConnection[Any]:
        """An idle connection of this loop (pinged if it sat `ping_idle` seconds), or a new one."""
        while here.idle:
            conn, used_at = here.idle.pop()
            if time.monotonic() - used_at < self.ping_idle:
                return conn
            try:
                await conn.execute("SELECT 1")
                return conn
            except psycopg.Error:
                await _close(conn)
        engine()  # the schema is checked once per process, as for every other connection
        url, schema, pooled = here.target
        conn = await psycopg.AsyncConnection.connect(
            **driver_args(url), autocommit=True, prepare_threshold=None if pooled else 0
        )
        arrays.register(conn)
        if not pooled:  # behind a pooler the server sets it (db/engine.check_search_path)
            await conn.execute(f'SET search_path TO "{schema}"')
        return conn


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):
        await conn.close()


def _fail(group: list[tuple[Any, asyncio.Future[Any]]], exc: Exception) -> None:
    for _, answer in group:
        if not answer.done():
            answer.set_exception(exc)
