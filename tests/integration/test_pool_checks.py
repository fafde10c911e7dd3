"""Pooled connections are checked without a round trip while in use (db/engine.py,
`ping_when_stale`): one the server closed is replaced at checkout, one that rested is pinged,
one in use is not."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import text

from clarion import settings
from clarion.db import engine as engine_module
from clarion.db.engine import driver_args, engine

pytestmark = pytest.mark.integration


def _pid() -> int:
    with engine().connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


@pytest.fixture
def pings(monkeypatch) -> list[int]:
    """The pings the engine's dialect sends (each call passed through to it)."""
    eng = engine()
    seen: list[int] = []
    ping = eng.dialect.do_ping

    def counted(dbapi_connection):
        seen.append(1)
        return ping(dbapi_connection)

    monkeypatch.setattr(eng.dialect, "do_ping", counted)
    return seen


def test_a_connection_the_server_closed_is_replaced_at_checkout(clarion_env, pings):
    first = _pid()  # back in the pool, idle
    with psycopg.connect(**driver_args(settings.get().urls()[0]), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [first])
        deadline = time.monotonic() + 10
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [first]).fetchone():
            assert time.monotonic() < deadline, "the backend did not exit"
            time.sleep(0.02)
    second = _pid()  # no error: the dead connection was replaced, not handed out
    assert second != first
    assert pings == []  # found without a round trip


def test_a_connection_in_use_is_not_pinged_and_one_that_rested_is(clarion_env, pings, monkeypatch):
    _pid()  # connected: the first checkout of a new connection needs no ping either
    for _ in range(20):
        _pid()
    assert pings == []
    monkeypatch.setattr(engine_module, "PING_IDLE", 0.0)  # every connection has rested long enough
    time.sleep(0.01)
    _pid()
    assert pings == [1]
