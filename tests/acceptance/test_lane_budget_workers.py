"""The activation lane's budget with real worker processes on the real broker (the lane is the queue
a message came from): a nudge backlog reaches the receiver at the budget's pace, while receipts
sent in the middle of it arrive at once."""

from __future__ import annotations

import time

import pytest

from clarion.records import idempotency_key
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many, register_recipient
from tests.support.cluster import Cluster, wait_settled

pytestmark = pytest.mark.acceptance

NUDGES, RATE = 90, 30.0


def test_a_nudge_backlog_goes_at_the_budget_and_receipts_do_not_wait(clarion_env, tmp_path):
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        env = {
            **clarion_env.env,
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_ACTIVATION_PER_SECOND": str(RATE),
        }
        cluster = Cluster(env, tmp_path / "logs")
        try:
            cluster.worker("lanes-a", ["activation"], concurrency=2)
            cluster.worker("lanes-t", ["transactional", "control"], concurrency=2)
            cluster.beat()
            cluster.wait_ready(["lanes-a", "lanes-t"], 60)
            register_recipient("ann", timezone="UTC")
            notify_many(
                [
                    dict(user_id="ann", type_key="nudge", event_id=f"n{i}", variables={"name": "A"})
                    for i in range(NUDGES)
                ]
            )
            deadline = time.monotonic() + 30
            while not receiver.arrivals.first_at and time.monotonic() < deadline:
                time.sleep(0.05)  # the receipts come once the backlog is being paced
            sent_at = time.monotonic()
            notify_many(
                [
                    dict(
                        user_id="ann", type_key="receipt", event_id=f"r{i}", variables={"order": i}
                    )
                    for i in range(3)
                ]
            )
            assert wait_settled(60, expect_sent=NUDGES + 3), "the pipeline did not settle"
        finally:
            cluster.stop_together()
    first = receiver.arrivals.first_at
    nudges = sorted(
        first[idempotency_key("ann", "nudge", f"event:n{i}", "webhook")] for i in range(NUDGES)
    )
    receipts = [
        first[idempotency_key("ann", "receipt", f"event:r{i}", "webhook")] for i in range(3)
    ]
    # 90 nudges at 30/s leave over 2.9 s (less the 0.1 s burst, and 0.5 s for the first slice's
    # own route and send); flat out they take a fraction of a second
    assert nudges[-1] - nudges[0] >= (NUDGES / RATE) - 0.1 - 0.5, nudges[-1] - nudges[0]
    busiest = max(sum(1 for t in nudges if s <= t < s + 1.0) for s in nudges)
    assert busiest <= 1.5 * RATE, busiest  # (a slow send can land beside the next slice's)
    assert max(receipts) - sent_at < 2.0 and max(receipts) < nudges[-1]
    assert receiver.arrivals.repeats == 0
