"""An idle tick costs one read: with nothing due, the beat tick runs one statement and logs nothing
at INFO; each kind of due work turns on its step, and the step then takes it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import InternalError

from clarion import arm_series, clock, notify, register_recipient
from clarion.db.due import what_is_due
from clarion.db.engine import engine
from clarion.tasks.app import app
from clarion.tasks.beat import Scheduler
from clarion.tasks.publish import ROUTE
from clarion.tasks.tick import LANES, tick
from tests.support.pipeline import frozen_clock, published, publishing_to_this_tests_broker

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _broker(clarion_env):
    with publishing_to_this_tests_broker():
        yield


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every statement this process sends to the database meanwhile (the pool's ping included)."""
    seen: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        seen.append(statement)

    eng = engine()
    event.listen(eng, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(eng, "before_cursor_execute", record)


@contextmanager
def read_only_at_the_server() -> Iterator[None]:
    """Every connection this process checks out meanwhile is read-only at PostgreSQL: a write
    (INSERT, UPDATE, DELETE, SELECT … FOR UPDATE, nextval) fails there, with its error."""
    eng = engine()

    def checkout(dbapi_conn, record, proxy) -> None:
        dbapi_conn.execute("SET default_transaction_read_only = on")
        dbapi_conn.commit()  # the transactions after this one

    def checkin(dbapi_conn, record) -> None:
        dbapi_conn.rollback()
        dbapi_conn.execute("SET default_transaction_read_only = off")
        dbapi_conn.commit()

    eng.dispose()  # connections made before are not read-only: start afresh
    event.listen(eng, "checkout", checkout)
    event.listen(eng, "checkin", checkin)
    try:
        yield
    finally:
        event.remove(eng, "checkout", checkout)
        event.remove(eng, "checkin", checkin)
        eng.dispose()


def _due():
    with engine().connect() as conn:
        return what_is_due(conn, now=clock.now(), lanes=LANES)


def test_an_idle_tick_runs_one_statement_and_logs_nothing_at_info(caplog):
    tick()  # connections open, statements compiled
    caplog.set_level(logging.INFO)
    with statements() as seen:
        taken = tick()
    assert set(taken.values()) == {0}
    assert len(seen) == 1 and "EXISTS" in seen[0], seen
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    assert not _due().anything


def test_idle_ticks_write_nothing_the_server_would_refuse_in_a_read_only_transaction(caplog):
    register_recipient("ann", timezone="UTC")  # a recipient, nothing due
    caplog.set_level(logging.INFO)
    with read_only_at_the_server():
        # the guard holds: the server refuses a write
        with engine().connect() as conn, pytest.raises(InternalError, match="read-only"):
            conn.execute(text("UPDATE recipients SET locale = 'de' WHERE user_id = 'ann'"))
        for _ in range(20):
            assert set(tick().values()) == {0}
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    # and a tick with work does write: the guard would have caught it
    with engine().begin() as conn:
        notify("ann", "receipt", event_id="e1", variables={"order": "1"}, connection=conn)
    with read_only_at_the_server(), pytest.raises(InternalError, match="read-only transaction"):
        tick()


class _Recording(Scheduler):
    """The beat's scheduler with Celery's send replaced by a list of what it would send."""

    def __init__(self, *args, **kwargs) -> None:
        self.sent: list[str] = []
        super().__init__(*args, **kwargs)

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        self.sent.append(entry.name)


def test_beat_sends_the_tick_only_when_something_is_due(tmp_path):
    beat = _Recording(app, schedule_filename=str(tmp_path / "schedule"), lazy=True)
    beat.setup_schedule()
    tick_entry, alerts_entry = beat.schedule["tick"], beat.schedule["alerts"]
    register_recipient("ann", timezone="UTC")
    beat.apply_entry(tick_entry)
    beat.apply_entry(alerts_entry)  # the other entries go on their schedule as before
    assert beat.sent == ["alerts"]
    with engine().begin() as conn:
        notify("ann", "receipt", event_id="e1", variables={"order": "1"}, connection=conn)
    beat.apply_entry(tick_entry)
    assert beat.sent == ["alerts", "tick"]


def test_beat_sleeps_until_an_entry_is_due_instead_of_polling_for_it(tmp_path):
    """Celery's scheduler woke 10 ms early and then polled without sleeping until the entry was
    due: about 250 passes a second with the two one-second entries. Driven as Celery's beat
    service drives it (tick, sleep what it says) for two seconds, with nothing due."""
    beat = _Recording(app, schedule_filename=str(tmp_path / "schedule"), lazy=True)
    beat.setup_schedule()
    intervals: list[float] = []
    ends = time.monotonic() + 2.0
    while time.monotonic() < ends:
        interval = beat.tick()
        intervals.append(interval)
        if interval and interval > 0:
            time.sleep(min(interval, max(0.0, ends - time.monotonic())))
    assert min(intervals) >= 0, "a negative interval is a pass that does not sleep"
    # each second: the due entries applied (0 each), then one sleep until the next second
    assert len(intervals) <= 16, f"{len(intervals)} passes in 2 s"
    assert sum(1 for i in intervals if i > 0) >= 2
    beat.close()


def test_an_outbox_row_turns_its_lanes_step_on_and_the_tick_publishes_it():
    register_recipient("ann", timezone="UTC")
    with engine().begin() as conn:  # written in the app's transaction: due at once
        request = notify("ann", "receipt", event_id="e1", variables={"order": "1"}, connection=conn)
    due = _due()
    assert due.requests == {"transactional"} and not due.deliveries and not due.series
    assert tick()["requests"] == 1
    assert published("transactional")[ROUTE] == [("ann", request.request_id)]
    assert not _due().anything  # pushed on by its take: the next tick is idle again


def test_a_due_series_turns_the_series_step_on_and_the_tick_fires_it():
    register_recipient("ann", timezone="UTC")
    start = datetime(2026, 6, 15, 9, 0)  # a Monday, 09:00 UTC
    arm_series("ann", "receipt", anchor=start, every="1d", variables={"order": "1"})
    with frozen_clock(datetime(2026, 6, 15, 8, 59, tzinfo=UTC)):
        assert not _due().series
    with frozen_clock(datetime(2026, 6, 15, 9, 0, 1, tzinfo=UTC)):
        assert _due().series
        assert tick()["series"] == 1
        assert not _due().series  # advanced to tomorrow
