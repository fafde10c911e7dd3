"""The send pool (tasks/send/pool.py): a batch ends whatever its senders meet."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from clarion.ops.launch import wait_until as launch_wait
from clarion.tasks.send.pool import Senders, Threads, Work


@dataclass(frozen=True)
class _Row:
    key: str
    channel: str = "webhook"


def _rows(*keys: str) -> list[_Row]:
    return [_Row(k) for k in keys]


class _Db:
    def close(self) -> None:
        pass


def _ended(senders: Senders) -> bool:
    """Run the batch on a thread named "batch"; whether it ended within 10 s (a bound on a hang,
    not a sleep: it returns as soon as the batch ends)."""
    done = threading.Event()

    def run() -> None:
        senders.run()
        done.set()

    threading.Thread(target=run, name="batch", daemon=True).start()
    return done.wait(10)


def test_a_sender_whose_connection_fails_is_counted_out_and_the_batch_ends() -> None:
    """A sender thread whose connect() raised (the database failing over) used to leave the batch's
    thread waiting for it forever: a worker host went silent in the multi-host soak run."""

    def connect() -> _Db:
        if threading.current_thread().name != "batch":
            raise OSError("connection refused")
        return _Db()

    work = Work(connect=connect, send=lambda db, row, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
    rows = _rows("row-1", "row-2", "row-3")
    senders = Senders(rows, work, senders=2, limit=2)  # type: ignore[arg-type]
    assert _ended(senders), "the batch waited for a sender that had died"
    assert senders.running == 0
    assert list(senders.todo) == rows  # nothing was sent: left to the claims' lease


class _BrokenDb:
    def close(self) -> None:
        raise OSError("the connection the fault broke cannot be closed cleanly")


def test_a_sender_whose_connection_fails_to_close_is_counted_out_too() -> None:
    def connect() -> _Db | _BrokenDb:
        return _Db() if threading.current_thread().name == "batch" else _BrokenDb()

    work = Work(connect=connect, send=lambda db, row, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
    senders = Senders(_rows("row-1", "row-2"), work, senders=2, limit=2)  # type: ignore[arg-type]
    assert _ended(senders), "the batch waited for a sender whose close() raised"
    assert senders.running == 0 and not senders.todo  # both rows went through send()


class _Slow:
    """An adapter whose send outlives any budget the test gives it, until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def send(self, message: object) -> str:
        self.release.wait(10)
        return "late"


def test_an_abandoned_sender_is_taken_out_once_and_the_batch_ends() -> None:
    """The batch's thread abandons a call past its deadline (settling its row as unknown) and
    starts a sender in its place; the abandoned thread, when its call comes back, adds nothing."""
    slow = _Slow()
    overdue: list[object] = []

    def send(db: object, row: _Row, senders: Senders) -> None:
        if row.key == "slow":
            senders.call(slow, None, row, 0.1)  # type: ignore[arg-type]

    work = Work(
        connect=_Db,  # type: ignore[arg-type]
        send=send,  # type: ignore[arg-type]
        overdue=lambda db, row, adapter, error: overdue.append(row.key),
    )
    senders = Senders(_rows("slow", "a", "b"), work, senders=1, limit=1)  # type: ignore[arg-type]
    assert _ended(senders), "the batch waited for its abandoned sender"
    assert overdue == ["slow"] and not senders.todo and senders.running == 0
    slow.release.set()  # the abandoned call comes back: it must not count out anyone else


def test_a_hand_off_no_thread_started_cannot_hold_the_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sender queued and never begun (no thread took it) is dropped after Senders.LOST, with an
    error in the log, instead of holding the batch (and the worker) forever."""
    work = Work(connect=_Db, send=lambda db, row, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
    senders = Senders(_rows("row-1"), work, senders=1, limit=1)  # type: ignore[arg-type]
    senders.WATCH, senders.LOST = 0.05, 0.2
    senders.queued.append(time.monotonic())  # a hand-off that no thread will ever begin
    assert _ended(senders)
    assert senders.running == 0 and not senders.todo
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "send pool: senders lost"
    ]


def test_a_sender_that_cannot_connect_returns_its_thread_to_the_pool() -> None:
    threads = Threads()
    failed = threading.Event()

    def connect() -> _Db:
        if threading.current_thread().name == "clarion-send":
            failed.set()
            raise OSError("connection refused")
        return _Db()

    work = Work(connect=connect, send=lambda db, row, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
    senders = Senders(_rows("row-1"), work, senders=1, limit=1)  # type: ignore[arg-type]
    threads.run(senders._sender)
    assert failed.wait(10)
    assert launch_wait(lambda: len(threads._idle) == 1, 10), "the sender's thread did not come back"
