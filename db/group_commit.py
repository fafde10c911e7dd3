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

Rows that many callers write alike need no savepoint each: `submit_rows(payload)` hands a payload
to `batch(connection, payloads)`, called once per group with every payload waiting, which returns
each payload's outcome (a result, or the exception for that caller alone) — one multi-row
statement for the whole group instead of a savepoint and statements per caller. If `batch`
raises, the transaction is rolled back and the group runs again with each payload in a savepoint
of its own (`batch(connection, [payload])`), so one bad payload still fails only its caller.
`submit`/`submit_rows` return a Future, for callers that wait on an event loop (asyncio's
`wrap_future`) rather than in a thread. `committed(pairs)`, if given, is called on the writer
thread once per group after its COMMIT, with (payload, result) of each `submit_rows` payload that
succeeded — work that must follow the commit (a publish), done once for the group instead of once
per caller; it is called after the callers were answered and must not raise.

`one_statement=True` says `batch` writes with a single statement (later statements only read): a
group of `submit_rows` payloads alone then runs it on an auto-committing connection, the statement
its own transaction — atomic and durable when it returns, as the COMMIT was, without the BEGIN and
COMMIT round trips. A group with any `submit` unit, and the retry after a failed batch, keep the
transaction and its savepoints.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from clarion.drain import Drain

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")
PING_IDLE = 1.0  # seconds a writer's connection may sit unused before it is pinged
RETRY_ALONE = {"40P01", "40001"}  # deadlock_detected, serialization_failure
# One group's payloads → each payload's outcome: its result, or the exception its caller gets.
Batch = Callable[[Connection, Sequence[Any]], Sequence[Any]]


@dataclass(eq=False)
class _Unit:
    work: Callable[[Connection], Any] | None  # None: `payload` goes to the group's batch
    payload: Any = None
    answer: Future[Any] = field(default_factory=Future)
    result: Any = None
    error: BaseException | None = None


class _BatchFailed(Exception):
    """The batch statement raised: the group runs again, a savepoint per payload."""


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


class GroupCommit(Generic[P, R]):
    """One writer thread per process (clarion.drain), started on first use."""

    def __init__(
        self,
        engine: Callable[[], Engine],
        *,
        max_units: int = 64,
        writers: int = 1,
        batch: Callable[[Connection, Sequence[P]], Sequence[R | BaseException]] | None = None,
        ping_idle: float = PING_IDLE,
        committed: Callable[[list[tuple[P, R]]], None] | None = None,
        one_statement: bool = False,
    ) -> None:
        self.engine = engine
        self.one_statement = one_statement
        self.committed = committed
        self.ping_idle = ping_idle
        self.batch = batch
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

    def submit_rows(self, payload: P) -> Future[R]:
        """`payload` to the group's `batch`, with every other payload waiting; its outcome once
        the transaction committed."""
        assert self.batch is not None, "this GroupCommit has no batch"
        unit = _Unit(None, payload)
        self._writer.put(unit)
        return unit.answer

    def queued(self) -> int:
        """Units handed to the writer and not yet answered."""
        return self._writer.waiting()

    def _group(self, units: list[_Unit]) -> None:
        try:
            try:
                self._commit(units, batched=True)
            except _BatchFailed:
                self._commit(units, batched=False)
            for unit in units:
                if unit.error is not None and _lost_a_race(unit.error):
                    self._alone(unit)
        finally:
            for unit in units:
                if unit.error is not None:
                    unit.answer.set_exception(unit.error)
                else:
                    unit.answer.set_result(unit.result)
        if self.committed is not None:
            done = [(u.payload, u.result) for u in units if u.work is None and u.error is None]
            if done:
                self.committed(done)

    def _commit(self, units: list[_Unit], *, batched: bool) -> None:
        for unit in units:
            unit.result, unit.error = None, None
        rows = [u for u in units if u.work is None] if batched else []
        alone = self.one_statement and len(rows) == len(units)  # the statement is the transaction
        conn = self._connection(autocommit=alone)
        try:
            if alone:
                self._batch(conn, rows)
            else:
                with conn.begin():
                    if rows:
                        self._batch(conn, rows)
                    for unit in units:
                        if unit.work is not None or not batched:
                            _in_savepoint(conn, unit, self._work(unit))
        except _BatchFailed:
            raise
        except BaseException as exc:  # the connection or the COMMIT failed: nobody's rows are in
            for unit in units:
                if unit.error is None:
                    unit.error = exc
        finally:
            setattr(self._kept, f"{_slot(alone)}_used_at", time.monotonic())
            if conn.invalidated or conn.closed:
                self._forget(autocommit=alone)  # lost: the next group opens a new one

    def _connection(self, *, autocommit: bool = False) -> Connection:
        """This writer thread's own connection (one transactional, one auto-committing), kept
        from group to group: no pool checkout and ping per group. Pinged only when it was idle
        `ping_idle` seconds (a server restarted or an idle session killed meanwhile); a new one
        when it was lost or the engine changed."""
        engine = self.engine()
        slot = _slot(autocommit)
        conn: Connection | None = getattr(self._kept, slot, None)
        if conn is not None and not (conn.closed or conn.invalidated or conn.engine is not engine):
            idle = time.monotonic() - getattr(self._kept, f"{slot}_used_at", 0.0)
            if idle < self.ping_idle or _answers(conn):
                return conn
        self._forget(autocommit=autocommit)
        conn = engine.connect()
        if autocommit:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        setattr(self._kept, slot, conn)
        return conn

    def _forget(self, *, autocommit: bool = False) -> None:
        slot = _slot(autocommit)
        conn: Connection | None = getattr(self._kept, slot, None)
        setattr(self._kept, slot, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _batch(self, conn: Connection, units: list[_Unit]) -> None:
        assert self.batch is not None
        try:
            outcomes = self.batch(conn, [u.payload for u in units])
        except Exception as exc:
            raise _BatchFailed from exc
        for unit, outcome in zip(units, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                unit.error = outcome
            else:
                unit.result = outcome

    def _work(self, unit: _Unit) -> Callable[[Connection], Any]:
        """What a unit runs on its own: its work, or its payload as a batch of one."""
        if unit.work is not None:
            return unit.work
        batch, payload = self.batch, unit.payload
        assert batch is not None

        def alone(conn: Connection) -> Any:
            [outcome] = batch(conn, [payload])
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return alone

    def _alone(self, unit: _Unit) -> None:
        unit.error = None
        try:
            with self.engine().begin() as conn:
                unit.result = self._work(unit)(conn)
        except BaseException as exc:
            unit.error = exc


def _slot(autocommit: bool) -> str:
    """Where a writer thread keeps its connection of that kind (and `<slot>_used_at`)."""
    return "auto" if autocommit else "conn"


def _in_savepoint(conn: Connection, unit: _Unit, work: Callable[[Connection], Any]) -> None:
    savepoint = conn.begin_nested()
    try:
        unit.result = work(conn)
    except BaseException as exc:
        unit.error = exc
        savepoint.rollback()
    else:
        savepoint.commit()
