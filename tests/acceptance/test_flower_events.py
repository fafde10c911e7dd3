"""Flower sees the work, not the clock: real beat and workers with task events on, and a Celery
event receiver (what Flower is) counting what arrives. Beat ticks several times a second, yet not
one event names clarion.tick, while the route task the tick published is there (and it sent the
delivery itself, in-process: no clarion.deliver task runs for a fresh notification)."""

from __future__ import annotations

import threading
import time
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
    stop = threading.Event()

    def listen() -> None:
        with app.connection_for_read(clarion_env.env["CLARION_BROKER_URL"]) as conn:

            def on_event(event: dict) -> None:
                if event.get("name"):
                    names[event["uuid"]] = event["name"]
                task = names.get(event.get("uuid", ""), "?")
                seen[(task, event["type"])] += 1

            receiver = app.events.Receiver(conn, handlers={"*": on_event})
            while not stop.is_set():
                try:
                    receiver.capture(limit=None, timeout=0.5, wakeup=True)
                except TimeoutError:
                    continue

    with Receiver(settings.get().webhook_secret) as hooks:
        env = {**clarion_env.env, "CLARION_TICK_INTERVAL": "0.2", "CLARION_WEBHOOK_URL": hooks.url}
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        cluster = Cluster(env, tmp_path / "logs")
        cluster.worker("lanes", ["transactional", "activation", "control"], concurrency=2)
        cluster.beat()
        try:
            register_recipient("ann", timezone="UTC")
            with engine().begin() as conn:  # an outbox row: only a tick publishes its route task
                notify("ann", "receipt", event_id="o1", variables={"order": "1"}, connection=conn)
            assert launch.wait_until(lambda: hooks.arrivals.total == 1, 60, 0.2)
            ticked_until = time.monotonic() + 2.0  # ten more ticks at 0.2 s
            while time.monotonic() < ticked_until:
                time.sleep(0.1)
        finally:
            cluster.stop()
            stop.set()
            listener.join(5)
    assert counts("SELECT count(*) FROM requests WHERE state = 'routed'") == 1
    by_task = Counter(task for task, _ in seen.elements())
    assert by_task["clarion.route"] > 0, seen
    assert "clarion.tick" not in by_task, seen
    assert "clarion.refresh_collapsed" not in by_task, seen  # nothing owed: the tick published none
    # The route task sends what it routes: the webhook that arrived is its work, seen in full.
    assert ("clarion.route", "task-succeeded") in seen
    assert "clarion.deliver" not in by_task, seen  # no deliver task for a fresh notification
    assert counts("SELECT count(*) FROM deliveries WHERE state = 'sent' AND attempts = 1") == 1
