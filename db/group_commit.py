"""Shared commits for many callers: units of work from many threads, one COMMIT for a group.

On this disk one connection committing one row per transaction tops out near 250 commits/s
(DESIGN.md section 7: 4.1 ms per WAL flush). `GroupCommit.run(work)` hands `work(connection)` to
this process's writer thread and blocks until the transaction that ran it committed: the writer
takes every unit that is waiting (up to `max_units`), runs each in its own SAVEPOINT, and commits
once. So a caller is answered only once its rows are durable, as with a transaction of its own, and
a unit that raises rolls back to its savepoint: its exception reaches its caller and the other
units of the group are not touched. While one group commits, the next gathers.

A unit must be a transaction's worth of work that does not commit itself, and must not depend on
running alone: units of one group see each other's rows (the Idempotency-Key row of the request
before it, say), exactly as they would after it committed. A unit that loses a deadlock or a
serialization failure to another process's transaction is run again alone, in a transaction of
its own. A COMMIT that fails fails every unit of its group: their callers get the error, as they
would have with their own commit. Each writer thread keeps one connection from group to group
(no pool checkout and ping per group; pinged only after a second unused); a connection lost with
its group is replaced for the next one.

`submit` returns a Future, for callers that wait on an event loop (asyncio's `wrap_future`) rather
than in a thread. Rows that many callers write alike, with one statement for the whole group and
no thread between the caller and the database, are db/loop_commit.py's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from clarion.drain import Drain

T = TypeVar("T")
PING_IDLE = 1.0  # seconds a writer's connection may sit unused before it is pinged
RETRY_ALONE = {"40P01", "40001"}  # deadlock_detected, serialization_failure


@dataclass(eq=False)
class _Unit:
    work: Callable[[Connection], Any]
    answer: Future[Any] = field(default_factory=Future)
    result: Any = None
    error: BaseException | None = None


def _answers(conn: Connection) -> bool:
    """A kept connection that was idle still reaches its server (SQLAlchemy's pre-ping, by hand)."""
    try:
        conn.exec_driver_sql("SELECT 1")
        conn.rollback()
        return True
    except DBAPIError:
        return False


def _lost_a_race(exc: BaseException) -> bool:
    code = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return isinstance(exc, DBAPIError) and code in RETRY_ALONE


class GroupCommit:
    """One writer thread per process (clarion.drain), started on first use."""

    def __init__(
        self,
        engine: Callable[[], Engine],
        *,
        max_units: int = 64,
        writers: int = 1,
        ping_idle: float = PING_IDLE,
    ) -> None:
        self.engine = engine
        self.ping_idle = ping_idle
        self._kept = threading.local()  # each writer thread's connection
        self._writer: Drain[_Unit] = Drain(
            "clarion-group-commit", self._group, most=max_units, threads=writers
        )

    def run(self, work: Callable[[Connection], T]) -> T:
        """`work(connection)` inside a shared transaction; its result once that committed."""
        answer: T = self.submit(work).result()
        return answer

    def submit(self, work: Callable[[Connection], T]) -> Future[T]:
        """run() without waiting: the Future is answered once the transaction committed."""
        unit = _Unit(work)
        self._writer.put(unit)
        return unit.answer

    def queued(self) -> int:
        """Units handed to the writer and not yet answered."""
        return self._writer.waiting()

    def _group(self, units: list[_Unit]) -> None:
        try:
            self._commit(units)
            for unit in units:
                if unit.error is not None and _lost_a_race(unit.error):
                    self._alone(unit)
        finally:
            for unit in units:
                if unit.error is not None:
                    unit.answer.set_exception(unit.error)
                else:
                    unit.answer.set_result(unit.result)

    def _commit(self, units: list[_Unit]) -> None:
        conn = self._connection()
        try:
            with conn.begin():
                for unit in units:
                    _in_savepoint(conn, unit, unit.work)
        except BaseException as exc:  # the connection or the COMMIT failed: nobody's rows are in
            for unit in units:
                if unit.error is None:
                    unit.error = exc
        finally:
            self._kept.used_at = time.monotonic()
            if conn.invalidated or conn.closed:
                self._forget()  # lost: the next group opens a new one

    def _connection(self) -> Connection:
        """This writer thread's own connection, kept from group to group: no pool checkout and
        ping per group. Pinged only when it was idle `ping_idle` seconds (a server restarted or an
        idle session killed meanwhile); a new one when it was lost or the engine changed."""
        engine = self.engine()
        conn: Connection | None = getattr(self._kept, "conn", None)
        if conn is not None and not (conn.closed or conn.invalidated or conn.engine is not engine):
            idle = time.monotonic() - getattr(self._kept, "used_at", 0.0)
            if idle < self.ping_idle or _answers(conn):
                return conn
        self._forget()
        self._kept.conn = conn = engine.connect()
        return conn

    def _forget(self) -> None:
        conn: Connection | None = getattr(self._kept, "conn", None)
        self._kept.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _alone(self, unit: _Unit) -> None:
        unit.error = None
        try:
            with self.engine().begin() as conn:
                unit.result = unit.work(conn)
        except BaseException as exc:
            unit.error = exc


def _in_savepoint(conn: Connection, unit: _Unit, work: Callable[[Connection], Any]) -> None:
    savepoint = conn.begin_nested()
    try:
        unit.result = work(conn)
    except BaseException as exc:
        unit.error = exc
        savepoint.rollback()
    else:
        savepoint.commit()
