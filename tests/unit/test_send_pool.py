"""The send pool (tasks/send/pool.py): a batch ends whatever its senders meet."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from clarion.ops.launch import wait_until as launch_wait
from clarion.tasks.send.pool import Senders, Threads, Work, pace, send_all


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

    work = Work(connect=connect, send=lambda db, rows, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
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

    work = Work(connect=connect, send=lambda db, rows, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
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
    overdue: list[Any] = []

    def send(db: object, rows: list[_Row], senders: Senders) -> None:
        for row in rows:
            if row.key == "slow":
                senders.call(slow, [None], [row], 0.1)  # type: ignore[arg-type, list-item]

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
    work = Work(connect=_Db, send=lambda db, rows, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
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

    work = Work(connect=connect, send=lambda db, rows, senders: None, overdue=lambda *a: None)  # type: ignore[arg-type]
    senders = Senders(_rows("row-1"), work, senders=1, limit=1)  # type: ignore[arg-type]
    threads.run(senders._sender)
    assert failed.wait(10)
    assert launch_wait(lambda: len(threads._idle) == 1, 10), "the sender's thread did not come back"


@dataclass(frozen=True)
class _Many:
    """An adapter with several calls in flight at once; `release` holds every send_many."""

    release: threading.Event
    sends_many: bool = True

    def send(self, message: object) -> str:
        return f"one {message}"

    def send_many(self, messages: list[object]) -> list[object]:
        self.release.wait(10)
        return [f"many {m}" for m in messages]


def _channel(answers_in: float | None) -> str:
    """A channel of its own (paces are per process), whose provider has answered in
    `answers_in` seconds (None: never called yet)."""
    name = f"hook-{uuid.uuid4().hex[:8]}"
    if answers_in is not None:
        pace(name).note(answers_in, answers_in)
    return name


def test_a_fast_providers_rows_go_in_slices_and_the_others_one_at_a_time() -> None:
    """Rows go in slices of at most the batch's share of its limit only where the channel has
    several calls in flight (`together`) and its provider answers fast; a slow provider's rows,
    a new provider's (no pace yet) and a channel without send_many go one row at a time."""
    fast, slow, new, email = _channel(0.001), _channel(0.5), _channel(None), _channel(0.001)
    slices: list[list[str]] = []
    results: list[object] = []
    many = _Many(threading.Event())
    many.release.set()

    def send(db: object, rows: list[_Row], senders: Senders) -> None:
        slices.append([r.key for r in rows])
        results.extend(senders.call(many, [r.key for r in rows], rows, 5))  # type: ignore[arg-type, misc]

    work = Work(
        connect=_Db,  # type: ignore[arg-type]
        send=send,  # type: ignore[arg-type]
        overdue=lambda *a: None,
        together=lambda row: row.channel != email,
    )
    rows = (
        [_Row(f"f{i}", fast) for i in range(5)]
        + [_Row(f"s{i}", slow) for i in range(2)]
        + [_Row(f"n{i}", new) for i in range(2)]
        + [_Row(f"e{i}", email) for i in range(2)]
    )
    senders = Senders(rows, work, senders=1, limit=3)  # type: ignore[arg-type]
    assert _ended(senders)
    alone = ["s0", "s1", "n0", "n1", "e0", "e1"]
    assert slices == [["f0", "f1", "f2"], ["f3", "f4"], *([k] for k in alone)]
    assert results == [f"many f{i}" for i in range(5)] + [f"one {k}" for k in alone]


def test_a_batch_of_a_fast_providers_rows_has_one_sender() -> None:
    """One sender has the batch's whole limit in flight, slice after slice; more threads would
    only contend for the GIL and wake more often."""
    fast = _channel(0.001)
    threads: set[str] = set()
    slices: list[int] = []

    def send(db: object, rows: list[_Row], senders: Senders) -> None:
        threads.add(threading.current_thread().name + str(threading.get_ident()))
        slices.append(len(rows))

    work = Work(connect=_Db, send=send, overdue=lambda *a: None, together=lambda row: True)  # type: ignore[arg-type]
    send_all([_Row(f"r{i}", fast) for i in range(10)], work, limit=4)  # type: ignore[misc]
    assert len(threads) == 1 and slices == [4, 4, 2]


def test_a_slice_past_its_budget_is_settled_row_by_row_and_the_rest_sent_by_a_new_sender() -> None:
    """A slice's calls share one deadline: past it, the batch's thread settles each of its rows as
    unknown (once each) and starts a sender in place of the one left waiting, which sends the
    rest; the abandoned calls' answers, when they come, count for nothing."""
    fast = _channel(0.001)
    many = _Many(threading.Event())
    overdue: list[Any] = []
    results: list[object] = []

    def send(db: object, rows: list[_Row], senders: Senders) -> None:
        if rows[0].key.startswith("slow"):
            senders.call(many, [r.key for r in rows], rows, 0.1)  # type: ignore[arg-type, misc]
        else:
            results.extend(r.key for r in rows)

    work = Work(
        connect=_Db,  # type: ignore[arg-type]
        send=send,  # type: ignore[arg-type]
        overdue=lambda db, row, adapter, error: overdue.append(row.key),
        together=lambda row: True,
    )
    rows = [_Row(k, fast) for k in ("slow-1", "slow-2", "a", "b")]
    senders = Senders(rows, work, senders=1, limit=2)  # type: ignore[arg-type]
    assert _ended(senders), "the batch waited for its abandoned sender"
    assert sorted(overdue) == ["slow-1", "slow-2"] and results == ["a", "b"]
    assert senders.running == 0 and not senders.todo
    many.release.set()
