"""Run a function in N real processes that start at the same instant, and collect the results;
and the evidence that contenders met: backends waiting on a lock another one holds."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import kombu.pools


class Raced(list[Any]):
    """The contenders' results, and when each was inside `fn` (CLOCK_MONOTONIC is one clock for
    every process on the host): the evidence that they met, not just that they were started."""

    spans: list[tuple[float, float]]

    def most_at_once(self) -> int:
        """The largest number of contenders inside `fn` at one instant."""
        edges = sorted(
            [(start, 1) for start, _ in self.spans] + [(end, -1) for _, end in self.spans]
        )
        inside = most = 0
        for _, step in edges:  # at a tie an end (-1) sorts first: touching spans did not meet
            inside += step
            most = max(most, inside)
        return most


def _run(fn: Callable[..., Any], args: tuple, barrier, queue) -> None:
    from clarion.db import engine

    engine.dispose_all()  # never reuse the parent's connections
    try:
        barrier.wait(timeout=60)
        start = time.monotonic()
        result = fn(*args)
        queue.put(("ok", result, (start, time.monotonic())))
    except BaseException as exc:  # reported to the parent, which fails the test
        queue.put(("error", repr(exc), None))
    queue.close()
    queue.join_thread()
    # Leave without running exit handlers: they would close broker connections inherited from the
    # parent (an AMQP connection closed by a child is reset for the parent too).
    os._exit(0)


def race(n: int, fn: Callable[..., Any], args_for: Callable[[int], tuple] = lambda i: ()) -> Raced:
    """Fork n processes; each waits at a barrier, then runs fn(*args_for(i)). Raises on any error.
    The results come in the order the contenders finished, with their spans (Raced.most_at_once)."""
    from clarion.tasks.app import app

    # A forked child drops the broker connections it inherits, and py-amqp's finaliser shuts down
    # the socket the parent shares. Close them before forking; the next publish reconnects.
    kombu.pools.reset()  # closes every pooled connection and forgets the pools
    app._after_fork()  # and Celery forgets its references to them
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_run, args=(fn, args_for(i), barrier, queue)) for i in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    errors = [r for kind, r, _ in results if kind == "error"]
    assert not errors, errors
    raced = Raced(r for _, r, _ in results)
    raced.spans = [span for _, _, span in results]
    return raced


def waiting_on(pid: int, within: float, *, at_least: int = 1) -> list[str]:
    """The statements of backends waiting on a lock that backend `pid` holds, polled until there
    are `at_least` (for up to `within` seconds; fewer, or [], if they did not come): a contender
    blocked on the winner's open transaction."""
    from sqlalchemy import text

    from clarion.db.engine import engine

    deadline = time.monotonic() + within
    while True:
        with engine().connect() as conn:
            found = list(
                conn.execute(
                    text(
                        "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
                        "AND CAST(:pid AS integer) = ANY(pg_blocking_pids(pid))"
                    ),
                    {"pid": pid},
                ).scalars()
            )
        if len(found) >= at_least or time.monotonic() >= deadline:
            return found
        time.sleep(0.01)


@dataclass
class Held:
    """What a held lock saw: the most backends queued behind it at one instant."""

    waiters: int = 0
    statements: list[str] = field(default_factory=list)

    def all_in(self, fragment: str) -> bool:
        """Whether every waiting statement contains `fragment` (whitespace collapsed): they were
        all at the contested statement, not queued somewhere else."""
        return bool(self.statements) and all(
            fragment in " ".join(q.split()) for q in self.statements
        )


def _queued(conn: Any) -> list[str]:
    """The statements of this database's backends waiting on a lock (behind the holder, or behind
    another waiter queued on the same row: PostgreSQL queues a row's waiters on its tuple lock)."""
    from sqlalchemy import text

    found = conn.execute(
        text(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
    ).scalars()
    conn.rollback()  # a fresh snapshot of pg_stat_activity on the next poll
    return list(found)


@contextmanager
def held(lock: str, params: dict[str, Any], *, waiters: int, within: float = 60) -> Iterator[Held]:
    """Take a row lock with `lock` (a SELECT ... FOR UPDATE of the row the contenders fight over,
    or an INSERT of the key they will all insert) in an open transaction, and release it (roll back) only once `waiters` backends queue on it,
    or after `within` seconds. Contenders run inside the block; afterwards `Held.waiters` says how
    many were waiting at once: `waiters` proves they all reached the contested row together (run
    one after another, at most one would have been waiting)."""
    from sqlalchemy import text

    from clarion.db.engine import engine

    seen = Held()
    holder = engine().connect()
    holder.execute(text(lock), params)

    def release() -> None:
        deadline = time.monotonic() + within
        with engine().connect() as conn:
            while True:
                queued = _queued(conn)
                if len(queued) > seen.waiters:
                    seen.waiters, seen.statements = len(queued), queued
                if seen.waiters >= waiters or time.monotonic() >= deadline:
                    break
                time.sleep(0.01)  # polling for an event that will come, not waiting for time
        holder.rollback()

    releaser = threading.Thread(target=release)
    releaser.start()
    try:
        yield seen
    finally:
        releaser.join()
        holder.close()
