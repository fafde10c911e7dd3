"""The send pool's batch thread (tasks/send/pool.py) when a sender cannot open its connection."""

from __future__ import annotations

import threading

from clarion.tasks.send.pool import Senders, Work


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
    rows = ["row-1", "row-2", "row-3"]
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
    senders = Senders(["row-1", "row-2"], work, senders=2, limit=2)  # type: ignore[list-item]
    assert _ended(senders), "the batch waited for a sender whose close() raised"
    assert senders.running == 0 and not senders.todo  # both rows went through send()
