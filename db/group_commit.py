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
would have with their own commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from clarion.drain import Drain

T = TypeVar("T")
RETRY_ALONE = {"40P01", "40001"}  # deadlock_detected, serialization_failure


@dataclass
class _Unit(Generic[T]):
    work: Callable[[Connection], T]
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None
    error: BaseException | None = None


def _lost_a_race(exc: BaseException) -> bool:
    code = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return isinstance(exc, DBAPIError) and code in RETRY_ALONE


class GroupCommit:
    """One writer thread per process (clarion.drain), started on first use."""

    def __init__(
        self, engine: Callable[[], Engine], *, max_units: int = 64, writers: int = 1
    ) -> None:
        self.engine = engine
        self._writer: Drain[_Unit[Any]] = Drain(
            "clarion-group-commit", self._group, most=max_units, threads=writers
        )

    def run(self, work: Callable[[Connection], T]) -> T:
        """`work(connection)` inside a shared transaction; its result once that committed."""
        unit: _Unit[T] = _Unit(work)
        self._writer.put(unit)
        unit.done.wait()
        if unit.error is not None:
            raise unit.error
        return unit.result  # type: ignore[return-value]

    def queued(self) -> int:
        """Units handed to the writer and not yet answered."""
        return self._writer.waiting()

    def _group(self, units: list[_Unit[Any]]) -> None:
        try:
            self._commit(units)
            for unit in units:
                if unit.error is not None and _lost_a_race(unit.error):
                    self._alone(unit)
        finally:
            for unit in units:
                unit.done.set()

    def _commit(self, units: list[_Unit[Any]]) -> None:
        try:
            with self.engine().connect() as conn, conn.begin():
                for unit in units:
                    _in_savepoint(conn, unit)
        except BaseException as exc:  # the connection or the COMMIT failed: nobody's rows are in
            for unit in units:
                if unit.error is None:
                    unit.error = exc

    def _alone(self, unit: _Unit[Any]) -> None:
        unit.error = None
        try:
            with self.engine().begin() as conn:
                unit.result = unit.work(conn)
        except BaseException as exc:
            unit.error = exc


def _in_savepoint(conn: Connection, unit: _Unit[Any]) -> None:
    savepoint = conn.begin_nested()
    try:
        unit.result = unit.work(conn)
    except BaseException as exc:
        unit.error = exc
        savepoint.rollback()
    else:
        savepoint.commit()
