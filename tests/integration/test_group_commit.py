"""db/group_commit.py on a real PostgreSQL: units from many threads share commits, each caller is
answered only once its rows are durable, a failing unit takes only its own rows with it, a unit
that loses a deadlock to another writer is run again alone, and a lost connection fails its group."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError, OperationalError

from clarion.db.engine import engine
from clarion.db.group_commit import GroupCommit

pytestmark = pytest.mark.integration


@pytest.fixture
def scratch(clarion_env) -> None:
    with engine().begin() as conn:
        conn.execute(text("CREATE TABLE scratch (k text PRIMARY KEY, tx bigint NOT NULL)"))
        conn.execute(text("INSERT INTO scratch VALUES ('row-1', 0), ('row-2', 0)"))


def _insert(key: str) -> Callable[[Connection], int]:
    def work(conn: Connection) -> int:
        tx = conn.execute(text("SELECT txid_current()")).scalar_one()
        conn.execute(text("INSERT INTO scratch VALUES (:k, :tx)"), {"k": key, "tx": tx})
        return int(tx)

    return work


def _visible(key: str) -> bool:
    """Seen from another connection: committed."""
    with engine().connect() as conn:
        return (
            conn.execute(text("SELECT 1 FROM scratch WHERE k = :k"), {"k": key}).first() is not None
        )


def _holding(table_row: str) -> tuple[Connection, int]:
    """A connection holding `table_row`'s lock, and its backend pid."""
    conn = engine().connect()
    conn.execute(text("SELECT 1 FROM scratch WHERE k = :k FOR UPDATE"), {"k": table_row})
    return conn, conn.execute(text("SELECT pg_backend_pid()")).scalar_one()


def _blocked_on(pid: int) -> int:
    with engine().connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"),
            {"pid": pid},
        ).scalar_one()


def _until(condition, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_units_waiting_together_share_one_commit_and_each_caller_sees_its_rows_durable(scratch):
    group = GroupCommit(engine)
    holder, pid = _holding("row-1")
    results: dict[str, int] = {}
    seen_at_answer: dict[str, bool] = {}

    def caller(key: str) -> None:
        results[key] = group.run(_insert(key))
        seen_at_answer[key] = _visible(key)

    def first(conn: Connection) -> int:  # blocks the writer on the held row: the rest queue up
        conn.execute(text("SELECT 1 FROM scratch WHERE k = 'row-1' FOR UPDATE"))
        return _insert("first")(conn)

    opener = threading.Thread(target=lambda: results.setdefault("first", group.run(first)))
    opener.start()
    _until(lambda: _blocked_on(pid) == 1, "the writer never reached the held row")
    callers = [threading.Thread(target=caller, args=(f"k{i}",)) for i in range(20)]
    for c in callers:
        c.start()
    _until(lambda: group.queued() == 21, "the callers never queued behind the writer")
    assert not _visible("first") and len(results) == 0  # nobody answered while the first waits
    holder.rollback()
    holder.close()
    for c in [opener, *callers]:
        c.join(30)
    assert len(results) == 21 and all(seen_at_answer.values())
    transactions = Counter(results.values())
    assert len(transactions) == 2, transactions  # the first alone; the 20 that waited, together
    assert sorted(transactions.values()) == [1, 20]


def test_a_failing_unit_rolls_back_only_its_own_rows(scratch):
    group = GroupCommit(engine)
    holder, pid = _holding("row-1")
    outcomes: dict[str, object] = {}

    def bad(conn: Connection) -> int:
        _insert("bad-row")(conn)
        conn.execute(text("INSERT INTO scratch VALUES ('k0', 0)"))  # k0 is taken: unique violation
        return 0

    def run(name: str, work) -> None:
        try:
            outcomes[name] = group.run(work)
        except DBAPIError as exc:
            outcomes[name] = exc

    def first(conn: Connection) -> int:
        conn.execute(text("SELECT 1 FROM scratch WHERE k = 'row-1' FOR UPDATE"))
        return _insert("k0")(conn)

    threads = [threading.Thread(target=run, args=("k0", first))]
    threads[0].start()
    _until(lambda: _blocked_on(pid) == 1, "the writer never reached the held row")
    for name, work in (("bad", bad), ("k1", _insert("k1")), ("k2", _insert("k2"))):
        threads.append(threading.Thread(target=run, args=(name, work)))
        threads[-1].start()
    _until(lambda: group.queued() == 4, "the units never queued together")
    holder.rollback()
    holder.close()
    for t in threads:
        t.join(30)
    assert isinstance(outcomes["bad"], DBAPIError) and "scratch_pkey" in str(outcomes["bad"])
    assert all(isinstance(outcomes[k], int) for k in ("k0", "k1", "k2"))
    assert [_visible(k) for k in ("k0", "k1", "k2", "bad-row")] == [True, True, True, False]


def test_a_unit_that_loses_a_deadlock_to_another_writer_is_run_again_alone(scratch):
    one, two = GroupCommit(engine), GroupCommit(engine)
    both_hold_one = threading.Barrier(2, timeout=30)
    attempts: Counter[str] = Counter()
    results: dict[str, object] = {}

    def crossing(name: str, first: str, then: str):
        def work(conn: Connection) -> str:
            attempts[name] += 1
            conn.execute(text("SELECT 1 FROM scratch WHERE k = :k FOR UPDATE"), {"k": first})
            if attempts[name] == 1:
                both_hold_one.wait()  # each writer holds one row and asks for the other's
            conn.execute(text("SELECT 1 FROM scratch WHERE k = :k FOR UPDATE"), {"k": then})
            conn.execute(text("UPDATE scratch SET tx = tx + 1 WHERE k IN ('row-1', 'row-2')"))
            return name

        return work

    def run(group: GroupCommit, name: str, first: str, then: str) -> None:
        results[name] = group.run(crossing(name, first, then))

    threads = [
        threading.Thread(target=run, args=(one, "a", "row-1", "row-2")),
        threading.Thread(target=run, args=(two, "b", "row-2", "row-1")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {"a": "a", "b": "b"}  # both callers answered with their result
    assert sorted(attempts.values()) == [1, 2]  # PostgreSQL chose one victim; it ran again
    with engine().connect() as conn:
        counts = conn.execute(text("SELECT tx FROM scratch WHERE k LIKE 'row-%'")).scalars()
        assert list(counts) == [2, 2]  # each unit's update is in, once


def test_a_connection_lost_mid_group_fails_every_unit_of_the_group_and_writes_nothing(scratch):
    group = GroupCommit(engine)
    holder, pid = _holding("row-1")
    outcomes: dict[str, object] = {}
    writer_pid: list[int] = []

    def first(conn: Connection) -> int:
        writer_pid.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        tx = _insert("k0")(conn)
        conn.execute(text("SELECT 1 FROM scratch WHERE k = 'row-1' FOR UPDATE"))
        return tx

    def run(name: str, work) -> None:
        try:
            outcomes[name] = group.run(work)
        except OperationalError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=("k0", first))]
    threads[0].start()
    _until(lambda: _blocked_on(pid) == 1, "the writer never reached the held row")
    threads.append(threading.Thread(target=run, args=("k1", _insert("k1"))))
    threads[-1].start()
    _until(lambda: group.queued() == 2, "the second unit never queued")
    holder.execute(text("SELECT pg_terminate_backend(:p)"), {"p": writer_pid[0]})
    holder.rollback()
    holder.close()
    for t in threads:
        t.join(30)
    assert isinstance(outcomes["k0"], OperationalError)
    assert not _visible("k0")
    # k1 was either in the killed group (the same error) or in the next one, on a new connection
    assert isinstance(outcomes["k1"], OperationalError | int)
    assert _visible("k1") == isinstance(outcomes["k1"], int)
    assert group.run(_insert("after")) and _visible("after")  # the writer lives on


def _backend(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _kill(pid: int) -> None:
    with engine().connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    _until(lambda: not _backend_alive(pid), "the killed backend is still there")


def _backend_alive(pid: int) -> bool:
    with engine().connect() as conn:
        query = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p")
        return bool(conn.execute(query, {"p": pid}).scalar_one())


@pytest.mark.direct(
    "kills the writer's server backend by pid, which a transaction pooler does not pin to it"
)
def test_the_writer_keeps_its_connection_and_replaces_one_killed_while_idle(scratch):
    """Groups after groups run on one kept connection; killed between groups (a restarted
    server, an idle session killed), the ping before the next group finds it lost and the group
    runs on a new connection: no caller sees the drop."""
    group = GroupCommit(engine, ping_idle=0.0)  # ping before every group
    first, again = group.run(_backend), group.run(_backend)
    assert first == again  # one connection, kept
    _kill(first)
    replaced = group.run(_backend)
    assert replaced != first
    assert group.run(_insert("after-kill")) and _visible("after-kill")


@pytest.mark.direct(
    "kills the writer's server backend by pid, which a transaction pooler does not pin to it"
)
def test_a_connection_killed_between_unpinged_groups_fails_one_group_then_is_replaced(scratch):
    """Within `ping_idle` of its last group the connection is trusted: killed meanwhile, the next
    group fails as a lost connection does (nothing written, every caller told), and the writer
    opens a new one for the group after it."""
    group = GroupCommit(engine, ping_idle=3600.0)
    pid = group.run(_backend)
    _kill(pid)
    with pytest.raises(OperationalError, match="terminat|closed|lost"):
        group.run(_insert("lost"))
    assert not _visible("lost")
    assert group.run(_backend) != pid
    assert group.run(_insert("next")) and _visible("next")
