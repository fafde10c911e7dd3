"""Flower sees the work, not the clock: real beat and workers with task events on, and a Celery
event receiver (what Flower is) counting what arrives. Beat ticks several times a second, yet not
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
            for user in ("ann", "bob"):
                register_recipient(user, timezone="UTC")
            _outbox("ann", "o1")
            assert launch.wait_until(lambda: hooks.arrivals.total == 1, 60, 0.2)
            assert launch.wait_until(lambda: by_task()["clarion.route"] > 0, 60, 0.2)  # live
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
