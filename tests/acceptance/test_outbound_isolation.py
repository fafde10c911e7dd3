"""A hanging app endpoint never stops sending (issue 25: "a slow or dead endpoint never slows
sending: its own queue and budget"), shown with real workers and beat, not by a timing ratio.

The endpoint (tests/support/endpoint.py) takes each outbound event's request and answers none
until the test ends, and the events timeout is longer than the test: every process that posts
to it stays inside that POST. Then notifications are sent, and all of them must arrive at the
webhook channel's receiver while the endpoint still holds its requests and has answered none
(both counted at the receiving servers).

- The documented layout (`clarion worker --lane events` apart from the sending lanes): the
  events worker is stuck, the sending worker is not.
- One `clarion worker` consuming every queue (the default without --lane), -c 2: only
  CLARION_EVENTS_PARALLEL (1) of its processes may be inside a POST to the endpoint; beat keeps
  publishing event rounds, and the rounds finding the turn taken skip the endpoint at once, so
  the other process goes on sending (tests/integration/test_outbound_events.py shows a round
  leaving an endpoint whose turn is taken).

bench/outbound.py measures the rates (bench/RESULTS.md).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import event_endpoints, notify_many, register_recipient
from tests.support.cluster import Cluster
from tests.support.endpoint import Call, Endpoint

pytestmark = pytest.mark.acceptance
HOLD = 600.0  # longer than the test: released by the test, never by a timeout
BEFORE, AFTER = 20, 200


def _wait(predicate, timeout: float) -> bool:
    return launch.wait_until(predicate, timeout, interval=0.2)


def run(clarion_env, tmp_path, workers: dict[str, Sequence[str]]) -> None:
    release = threading.Event()
    answered = []

    def hang(call: Call) -> int:
        release.wait(HOLD)
        answered.append(call)
        return 204

    users = [f"u{n}" for n in range(10)]
    for user in users:
        register_recipient(user, timezone="UTC")
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver, Endpoint(hang) as app:
        event_endpoints.create(app.url, ["*"])
        env = {
            **clarion_env.env,
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_TICK_INTERVAL": "0.5",
            "CLARION_EVENTS_TIMEOUT": str(HOLD),
            "CLARION_EVENTS_BATCH": "1",  # a round leases one event: the next round finds more
        }
        cluster = Cluster(env, tmp_path / "logs")
        try:
            for name, queues in workers.items():
                cluster.worker(name, queues, concurrency=2)
            cluster.beat()
            cluster.wait_ready(list(workers), timeout=90)

            def send(first: int, n: int) -> None:
                notify_many(
                    [
                        dict(
                            user_id=users[k % len(users)],
                            type_key="receipt",
                            event_id=f"e{k}",
                            variables={"order": str(k)},
                        )
                        for k in range(first, first + n)
                    ]
                )

            send(0, BEFORE)
            # a process is inside a POST the endpoint holds; beat goes on publishing a round
            # every tick while the rest is sent
            assert _wait(lambda: len(app.calls) >= 1, 60), "no event reached the endpoint"
            send(BEFORE, AFTER)
            sent = _wait(lambda: receiver.arrivals.unique >= BEFORE + AFTER, 120)
            held, done = len(app.calls), len(answered)
        finally:
            release.set()
            cluster.stop_together()
    assert sent, f"{receiver.arrivals.unique} of {BEFORE + AFTER} sent while the endpoint hung"
    assert held >= 1 and done == 0  # the endpoint held every request it got and answered none
    assert app.errors == []


def test_a_hanging_endpoint_holds_only_the_events_worker(clarion_env, tmp_path):
    run(
        clarion_env,
        tmp_path,
        {"lanes": ("transactional", "activation", "control"), "events": ("events",)},
    )


def test_a_hanging_endpoint_holds_one_process_of_a_worker_on_every_queue(clarion_env, tmp_path):
    run(clarion_env, tmp_path, {"all": launch.QUEUES})
