"""The lanes' feedback signal (tasks/lanes.py) on real Redis: a transactional task's mark is seen
by every process while it runs and gone after, other lanes mark nothing, a mark left by a process
that died stops counting when its lease ends, and a bulk route batch waits for a mark to go; a bulk worker's PostgreSQL backend is reniced where
the server is on this host, and left alone behind a pooler."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from clarion.db.engine import engine
from clarion.standins.receiver import Receiver
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


def _nudges_arrive(receiver: Receiver, tag: str) -> list[float]:
    """Route six nudges for new recipients as the activation lane's worker would (it sends what it
    routed itself) and return their arrival times at the receiver, in order."""
    users = [f"{tag}{n}" for n in range(6)]
    for user in users:
        register_recipient(user, timezone="UTC")
    made = notify_many(
        [dict(user_id=u, type_key="nudge", event_id=f"{u}-n", variables={"name": u}) for u in users]
    )
    drain("activation")
    route.apply(args=[users, [m.request_id for m in made]], routing_key="activation")
    arrivals = receiver.arrivals
    with arrivals.lock:
        keys = {k for o, ks in arrivals.occurrences.items() if o.split("/")[0] in users for k in ks}
        return sorted(arrivals.first_at[k] for k in keys)


@pytest.mark.parametrize("feedback", ["off", "on"])
def test_a_bulk_batch_sends_one_at_a_time_while_transactional_work_is_about(
    clarion_env, monkeypatch, feedback
):
    latency = 0.15  # each answer takes this long: sends in parallel arrive together
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"], latency=latency) as receiver:
        configure(monkeypatch, bulk_feedback=feedback, webhook_url=receiver.url, send_concurrency=4)
        lanes._pacer = None
        alone = _nudges_arrive(receiver, "quiet")
        assert len(alone) == 6
        assert alone[3] - alone[0] < latency, f"no transactional work, yet one at a time: {alone}"
        with lanes.transactional_work("transactional"):
            pass  # a receipt came and went: the bulk lanes stay careful for RECENT seconds
        assert lanes.sends_beside(["activation"], 4) == 1
        assert lanes.sends_beside(["transactional"], 4) == 4
        lanes._pacer = None
        careful = _nudges_arrive(receiver, "busy")
        assert len(careful) == 6
        gaps = [b - a for a, b in zip(careful, careful[1:], strict=False)]
        assert min(gaps) >= latency * 0.9, f"sent together beside transactional work: {gaps}"
        configure(monkeypatch, bulk_sends_beside=0, webhook_url=receiver.url, send_concurrency=4)
        assert lanes.sends_beside(["activation"], 4) == 4  # turned off: as many as allowed
        assert lanes.runtime.redis().ttl(lanes.SEEN) <= lanes.RECENT


def test_bulk_lanes_send_as_many_as_allowed_when_redis_is_unreachable(clarion_env, monkeypatch):
    configure(monkeypatch, redis_url="redis://127.0.0.1:9/0")  # nothing listens on port 9
    with lanes.transactional_work("transactional"):  # the mark is lost, the task goes on
        assert lanes.sends_beside(["activation"], 8) == 8


@pytest.mark.direct("a backend behind a pooler is left alone (the next test)")
def test_a_backend_on_this_host_is_reniced(clarion_env):
    raw = engine().raw_connection()
    try:
        with raw.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        before = os.getpriority(os.PRIO_PROCESS, pid)
        group = Path(f"/proc/{pid}/autogroup")
        group_before = group.read_text().split() if group.exists() else None
        assert lanes.renice_backend(raw.driver_connection, 3) is None
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, before + 3)
        if group_before is not None:
            # PostgreSQL's backend leads a session of its own: under autogroup its niceness
            # would weigh against nothing, so its group's is raised too (tests/integration/
            # test_lane_session_nice.py shows what the group's niceness does)
            assert os.getsid(pid) == pid
            after = group.read_text().split()
            assert after[0] == group_before[0]  # the same group
            assert int(after[-1]) == min(19, int(group_before[-1]) + 3)
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
