"""Flower sees the work, not the clock: real beat and workers, task events asked for as Flower asks
(the `enable_events` control command; workers send none by default), and a Celery event receiver
(what Flower is) counting what arrives. Beat ticks several times a second, yet not
one event names clarion.tick, while the route task the tick published is there (and it sent the
delivery itself, in-process: no clarion.deliver task runs for a fresh notification).

The absence is read by event order, not over a guessed quiet spell: a tick's first event
(task-received, from the worker's consumer) would go out before the route task that the tick
publishes is even received. So once the route task of an outbox row made after the listener was
seen live has arrived, the tick that published it would have been seen too."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from clarion import settings
from clarion.db.engine import engine
from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.app import app
from tests.support.cluster import Cluster, counts

pytestmark = pytest.mark.acceptance


def test_ticks_send_no_task_events_and_the_work_they_publish_does(
    clarion_env, tmp_path, monkeypatch
):
    seen: Counter[tuple[str, str]] = Counter()
    names: dict[str, str] = {}
    args: dict[str, str] = {}  # task-received carries the task's arguments
    stop = threading.Event()

    def listen() -> None:
        with app.connection_for_read(clarion_env.env["CLARION_BROKER_URL"]) as conn:

            def on_event(event: dict) -> None:
                if event.get("name"):
                    names[event["uuid"]] = event["name"]
                    args[event["uuid"]] = str(event.get("args", ""))
                task = names.get(event.get("uuid", ""), "?")
                seen[(task, event["type"])] += 1

            receiver = app.events.Receiver(conn, handlers={"*": on_event})
            while not stop.is_set():
                try:
                    receiver.capture(limit=None, timeout=0.5, wakeup=True)
                except TimeoutError:
                    continue

    def by_task() -> Counter[str]:
        tasks: Counter[str] = Counter()
        for (task, _), n in dict(seen).items():  # a copy: the listener thread keeps adding
            tasks[task] += n
        return tasks

    with Receiver(settings.get().webhook_secret) as hooks:
        env = {**clarion_env.env, "CLARION_TICK_INTERVAL": "0.2", "CLARION_WEBHOOK_URL": hooks.url}
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        cluster = Cluster(env, tmp_path / "logs")
        cluster.worker("lanes", ["transactional", "activation", "control"], concurrency=2)
        cluster.beat()
        try:
            cluster.wait_ready(["lanes"], 60)
            for user in ("ann", "bob"):
                register_recipient(user, timezone="UTC")
            _outbox("ann", "o1")
            # as Flower does, every few seconds: a worker that has not consumed the first
            # command yet takes the next
            assert launch.wait_until(
                lambda: app.control.enable_events() or by_task()["clarion.route"] > 0, 60, 1.0
            )  # live
            assert launch.wait_until(lambda: hooks.arrivals.total == 1, 60, 0.2)
            _outbox("bob", "o2")  # the marker: only a tick after this point publishes its route
            assert launch.wait_until(lambda: _routed("bob", names, args), 60, 0.2)
            assert launch.wait_until(lambda: hooks.arrivals.total == 2, 60, 0.2)
        finally:
            cluster.stop()
            stop.set()
            listener.join(5)
    assert counts("SELECT count(*) FROM requests WHERE state = 'routed'") == 2
    tasks = by_task()
    assert tasks["clarion.route"] > 0, seen
    assert "clarion.tick" not in tasks, seen
    assert "clarion.refresh_collapsed" not in tasks, seen  # nothing owed: the tick published none
    # The route task sends what it routes: the webhook that arrived is its work, seen in full.
    assert ("clarion.route", "task-succeeded") in seen
    assert "clarion.deliver" not in tasks, seen  # no deliver task for a fresh notification
    assert counts("SELECT count(*) FROM deliveries WHERE state = 'sent' AND attempts = 1") == 2


def _outbox(user: str, event: str) -> None:
    """A notification as an outbox row: only a beat tick publishes its route task."""
    with engine().begin() as conn:
        notify(user, "receipt", event_id=event, variables={"order": event}, connection=conn)


def _routed(user: str, names: dict[str, str], args: dict[str, str]) -> bool:
    """The listener has seen the route task of `user`'s request arrive at a worker."""
    return any(names.get(u) == "clarion.route" and repr(user) in a for u, a in list(args.items()))


def test_task_events_go_out_only_once_asked_for(clarion_env, tmp_path):
    """By default a worker sends heartbeats but no task events; after `enable_events` (what Flower
    sends when it starts, and every 5 s) it sends them for the next task."""
    seen: list[tuple[str, str]] = []  # (event type, task uuid)
    stop = threading.Event()

    def listen() -> None:
        with app.connection_for_read(clarion_env.env["CLARION_BROKER_URL"]) as conn:
            receiver = app.events.Receiver(
                conn, handlers={"*": lambda e: seen.append((e["type"], e.get("uuid", "")))}
            )
            while not stop.is_set():
                try:
                    receiver.capture(limit=None, timeout=0.5, wakeup=True)
                except TimeoutError:
                    continue

    with Receiver(settings.get().webhook_secret) as hooks:
        env = {**clarion_env.env, "CLARION_WEBHOOK_URL": hooks.url}
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        cluster = Cluster(env, tmp_path / "logs")
        cluster.worker("quiet", ["transactional", "activation", "control"], concurrency=1)
        try:
            cluster.wait_ready(["quiet"], 60)
            register_recipient("ann", timezone="UTC")
            # heartbeats flow, so the listener hears this worker
            assert launch.wait_until(lambda: ("worker-heartbeat", "") in seen, 30, 0.2)
            notify("ann", "receipt", event_id="e1", variables={"order": "e1"})
            assert launch.wait_until(lambda: hooks.arrivals.total == 1, 60, 0.2)
            # the route task has returned: nothing is active on the worker any more
            assert launch.wait_until(lambda: _idle(app.control.inspect().active()), 30, 0.2)
            quiet = [e for e in list(seen) if e[0].startswith("task-")]
            heartbeats = sum(1 for e in list(seen) if e[0] == "worker-heartbeat")
            app.control.enable_events()
            notify("ann", "receipt", event_id="e2", variables={"order": "e2"})
            assert launch.wait_until(lambda: hooks.arrivals.total == 2, 60, 0.2)
            assert launch.wait_until(lambda: "task-succeeded" in {t for t, _ in seen}, 30, 0.2)
        finally:
            cluster.stop()
            stop.set()
            listener.join(5)
    assert quiet == [], quiet
    assert heartbeats >= 1
    asked = {t for t, _ in seen if t.startswith("task-")}
    assert {"task-received", "task-started", "task-succeeded"} <= asked, asked


def _idle(active: dict[str, list[object]] | None) -> bool:
    """`inspect().active()` answered and every worker runs nothing."""
    return bool(active and all(not tasks for tasks in active.values()))
