"""The database connection a sending thread writes its rows' outcomes through."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)
T = TypeVar("T")


class RowConnection:
    """One auto-committing connection for a sending thread, replaced after a database error (a
    restart mid-batch must cost the rows in flight, not the thread's whole share). `begin()`
    opens a transaction on the same engine, for an outcome written with its decision."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.conn: Connection | None = None

    def run(self, statement: Callable[[Connection], T]) -> T:
        if self.conn is None:
            self.conn = self.engine.execution_options(isolation_level="AUTOCOMMIT").connect()
        try:
            return statement(self.conn)
        except DBAPIError:
            self.close()
            raise

    def begin(self) -> AbstractContextManager[Connection]:
        """A transaction of its own (use as `with db.begin() as tx:`)."""
        return self.engine.begin()

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # a dead connection may not even close cleanly
                log.debug("connection not closed cleanly", exc_info=True)
            self.conn = None
