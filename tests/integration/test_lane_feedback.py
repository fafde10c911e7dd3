"""The lanes' feedback signal (tasks/lanes.py) on real Redis: a transactional task's mark is seen
by every process while it runs and gone after, other lanes mark nothing, a mark left by a process
that died stops counting when its lease ends, and a bulk route batch waits for a mark to go; a bulk worker's PostgreSQL backend is reniced where
the server is on this host, and left alone behind a pooler."""

from __future__ import annotations

import os
import threading
import time

import pytest

from clarion.db.engine import engine
from clarion.tasks import lanes, notify_many, register_recipient, runtime
from clarion.tasks.route import route
from tests.support.pipeline import configure, drain

pytestmark = pytest.mark.integration


def test_a_transactional_task_is_in_flight_while_it_runs(clarion_env, monkeypatch):
    configure(monkeypatch, bulk_feedback="on")
    assert lanes.transactional_active() == 0
    with lanes.transactional_work("transactional"):
        with lanes.transactional_work("transactional"):
            assert lanes.transactional_active() == 2
        assert lanes.transactional_active() == 1
    assert lanes.transactional_active() == 0
    with lanes.transactional_work("activation"), lanes.transactional_work(None):
        assert lanes.transactional_active() == 0


def test_a_mark_whose_lease_ran_out_stops_counting(clarion_env, monkeypatch):
    configure(monkeypatch, bulk_feedback="on")
    seconds, micros = runtime.redis().time()
    now_ms = seconds * 1000 + micros // 1000
    runtime.redis().zadd(lanes.ACTIVE, {"died": now_ms - 1, "alive": now_ms + 60_000})
    assert lanes.transactional_active() == 1
    assert runtime.redis().zrange(lanes.ACTIVE, 0, -1) == [b"alive"]


def test_the_feedback_off_marks_nothing(clarion_env, monkeypatch):
    configure(monkeypatch, bulk_feedback="off")
    with lanes.transactional_work("transactional"):
        assert lanes.transactional_active() == 0


def test_a_bulk_batch_waits_for_transactional_work_in_flight(clarion_env, monkeypatch):
    configure(monkeypatch, bulk_feedback="on")
    lanes._pacer = None  # a fresh pacer for this process
    register_recipient("ann", timezone="UTC")
    made = notify_many(
        [dict(user_id="ann", type_key="nudge", event_id="n1", variables={"name": "Ann"})]
    )
    drain("activation")
    done = threading.Event()
    with lanes.transactional_work("transactional"):
        routing = threading.Thread(
            target=lambda: (
                route.apply(args=[["ann"], [made[0].request_id]], routing_key="activation"),
                done.set(),
            )
        )
        began = time.monotonic()
        routing.start()
        assert not done.wait(0.2), "the bulk batch went while a receipt was in flight"
    routing.join(30)
    assert done.is_set() and time.monotonic() - began >= 0.2
    assert lanes.pacer().budget.rate < lanes.Feedback().ceiling  # and it slowed down


@pytest.mark.direct("a backend behind a pooler is left alone (the next test)")
def test_a_backend_on_this_host_is_reniced(clarion_env):
    raw = engine().raw_connection()
    try:
        with raw.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        before = os.getpriority(os.PRIO_PROCESS, pid)
        assert lanes.renice_backend(raw.driver_connection, 3) is None
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, before + 3)
    finally:
        raw.invalidate()  # a niced backend goes with its connection, not back to the pool


def test_a_backend_behind_a_pooler_is_left_alone(clarion_env, monkeypatch):
    raw = engine().raw_connection()
    configure(monkeypatch, database_pooler="transaction")
    try:
        why = lanes.renice_backend(raw.driver_connection, 3)
    finally:
        raw.invalidate()
    assert why is not None and "pooler" in why
