"""db/loop_commit.py on a real PostgreSQL: payloads awaited together on an event loop share one
statement, each caller is answered once its row is durable (seen from another connection), a bad
payload fails only its caller, a lost connection fails the group on it and is replaced (or, idle,
found by the ping first), and another event loop starts afresh and closes the first one's
connections."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from clarion import settings
from clarion.db.engine import engine
from clarion.db.loop_commit import LoopCommit

pytestmark = pytest.mark.integration


@pytest.fixture
def scratch(clarion_env) -> None:
    with engine().begin() as conn:
        conn.execute(text("CREATE TABLE scratch (k text PRIMARY KEY CHECK (k <> 'bad'))"))


class Recorder:
    """A batch that inserts its payloads in one statement and remembers each call."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.connections: list[psycopg.AsyncConnection[Any]] = []
        self.seen_at_answer: dict[str, bool] = {}

    async def __call__(
        self, conn: psycopg.AsyncConnection[Any], keys: Sequence[str]
    ) -> list[int | BaseException]:
        """Each key's length; a key starting with `refuse` is that payload's own refusal."""
        self.groups.append(list(keys))
        if conn not in self.connections:
            self.connections.append(conn)
        taken = [k for k in keys if not k.startswith("refuse")]
        await conn.execute("INSERT INTO scratch SELECT unnest(%s::text[])", (taken,))
        return [ValueError(f"refused {k}") if k.startswith("refuse") else len(k) for k in keys]


def _committed() -> set[str]:
    """Seen from another connection: committed."""
    with engine().connect() as conn:
        return set(conn.execute(text("SELECT k FROM scratch")).scalars())


async def _submit_all(writer: LoopCommit[str, int], keys: list[str]) -> list[Any]:
    return await asyncio.gather(*(writer.submit_rows(k) for k in keys), return_exceptions=True)


def test_payloads_waiting_together_share_one_statement_each_answered_durable(scratch):
    batch = Recorder()
    done: list[list[tuple[str, int]]] = []
    writer: LoopCommit[str, int] = LoopCommit(batch, connections=2, committed=done.append)

    async def caller(key: str) -> int:
        length = await writer.submit_rows(key)
        batch.seen_at_answer[key] = key in _committed()
        return length

    keys = [f"key-{n}" for n in range(12)]

    async def main() -> list[int]:
        first = asyncio.ensure_future(caller("first"))
        await asyncio.sleep(0)  # `first` starts a flush; the others gather while it runs
        return [await first, *await asyncio.gather(*(caller(k) for k in keys))]

    assert asyncio.run(main()) == [5, *[len(k) for k in keys]]
    assert sorted(k for group in batch.groups for k in group) == sorted(["first", *keys])
    assert len(batch.groups) < 13, "payloads waiting together share statements"
    assert all(batch.seen_at_answer.values()) and len(batch.seen_at_answer) == 13
    assert sorted(k for group in done for k, _ in group) == sorted(["first", *keys])


def test_a_bad_payload_fails_only_its_caller(scratch):
    batch = Recorder()
    done: list[list[tuple[str, int]]] = []
    writer: LoopCommit[str, int] = LoopCommit(batch, connections=1, committed=done.append)
    outcomes = asyncio.run(_submit_all(writer, ["a", "bad", "b", "c"]))
    assert outcomes[0] == 1 and outcomes[2:] == [1, 1]
    assert isinstance(outcomes[1], psycopg.errors.CheckViolation)
    assert batch.groups[0] == ["a", "bad", "b", "c"]  # together first, then one by one
    assert batch.groups[1:] == [["a"], ["bad"], ["b"], ["c"]]
    assert _committed() == {"a", "b", "c"}
    assert [k for group in done for k, _ in group] == [
        "a",
        "b",
        "c",
    ]  # the bad one is not passed on


def test_a_payload_refused_by_the_batch_fails_alone_in_the_shared_statement(scratch):
    batch = Recorder()
    done: list[list[tuple[str, int]]] = []
    writer: LoopCommit[str, int] = LoopCommit(batch, connections=1, committed=done.append)
    outcomes = asyncio.run(_submit_all(writer, ["a", "refuse-b", "c"]))
    assert outcomes[0] == 1 and outcomes[2] == 1
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "refused refuse-b"
    assert batch.groups == [["a", "refuse-b", "c"]]  # one statement, no retry
    assert _committed() == {"a", "c"} and done == [[("a", 1), ("c", 1)]]


def _terminate(conn: psycopg.AsyncConnection[Any]) -> None:
    with engine().connect() as other:
        other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": conn.info.backend_pid})


@pytest.mark.direct(
    "kills the connection's server backend by pid, which a transaction pooler does not pin to it"
)
def test_a_lost_connection_fails_its_group_and_is_replaced(scratch):
    batch = Recorder()
    writer: LoopCommit[str, int] = LoopCommit(batch, connections=1, ping_idle=3600)

    async def main() -> tuple[Any, Any, Any]:
        first = await writer.submit_rows("first")
        _terminate(batch.connections[0])
        lost = (await _submit_all(writer, ["lost"]))[0]
        after = await writer.submit_rows("after")
        return first, lost, after

    first, lost, after = asyncio.run(main())
    assert (first, after) == (5, 5)
    assert isinstance(lost, psycopg.OperationalError)
    assert len(batch.connections) == 2 and batch.connections[0].closed
    assert _committed() == {"first", "after"}


@pytest.mark.direct(
    "kills the connection's server backend by pid, which a transaction pooler does not pin to it"
)
def test_an_idle_connection_is_pinged_and_a_dead_one_replaced_unnoticed(scratch):
    batch = Recorder()
    writer: LoopCommit[str, int] = LoopCommit(batch, connections=1, ping_idle=0.0)

    async def main() -> tuple[int, int]:
        first = await writer.submit_rows("first")
        _terminate(batch.connections[0])
        return first, await writer.submit_rows("second")

    assert asyncio.run(main()) == (5, 6)
    assert len(batch.connections) == 2 and batch.connections[0].closed
    assert _committed() == {"first", "second"}


def test_another_event_loop_starts_afresh_and_closes_the_first_ones_connections(scratch):
    batch = Recorder()
    writer: LoopCommit[str, int] = LoopCommit(batch, connections=2)
    assert asyncio.run(_submit_all(writer, ["one", "two"])) == [3, 3]
    first_loops = list(batch.connections)
    assert first_loops and not any(c.closed for c in first_loops)
    assert asyncio.run(_submit_all(writer, ["three"])) == [5]
    assert all(c.closed for c in first_loops)
    assert batch.connections[-1] not in first_loops
    assert _committed() == {"one", "two", "three"}


def test_an_unreachable_database_fails_the_callers_without_hanging(scratch, monkeypatch):
    batch = Recorder()
    writer: LoopCommit[str, int] = LoopCommit(batch, connections=1)
    monkeypatch.setenv("CLARION_DATABASE_URL", "postgresql://clarion@127.0.0.1:9/nowhere")
    settings.reset()
    try:
        outcomes = asyncio.run(asyncio.wait_for(_submit_all(writer, ["x", "y"]), 30))
    finally:
        monkeypatch.undo()
        settings.reset()
    assert [type(o).__name__ for o in outcomes] == ["OperationalError"] * 2
    assert batch.groups == []


def test_a_batch_that_answers_wrongly_fails_its_callers_and_the_writer_goes_on(scratch, caplog):
    """A bug in a batch (fewer outcomes than payloads) or in `committed` reaches the callers or the
    log, never leaves a caller waiting, and the next group is written."""
    batch = Recorder()
    calls = 0

    async def short(conn: psycopg.AsyncConnection[Any], keys: Sequence[str]) -> list[Any]:
        nonlocal calls
        calls += 1
        return [] if calls == 1 else await batch(conn, keys)

    def committed(done: list[tuple[str, int]]) -> None:
        raise RuntimeError("committed failed")

    writer: LoopCommit[str, int] = LoopCommit(short, connections=1, committed=committed)

    async def main() -> tuple[list[Any], int]:
        wrong = await asyncio.wait_for(_submit_all(writer, ["a", "b"]), 30)
        return wrong, await asyncio.wait_for(writer.submit_rows("after"), 30)

    wrong, after = asyncio.run(main())
    assert [type(o).__name__ for o in wrong] == ["ValueError", "ValueError"]  # zip(strict=True)
    assert after == 5 and _committed() == {"after"}
    assert [r.getMessage() for r in caplog.records if r.name == "clarion.db.loop_commit"] == [
        "a group's write failed",
        "after a group's commit",
    ]
