"""The send ledger under real worker processes, killed at random, counted at the receiving server."""

from __future__ import annotations

import random
import threading
import time

import pytest
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many, register_recipient
from clarion.tasks.publish import DELIVER, ROUTE, publish
from tests.support.cluster import Cluster, counts, mixed_requests, occurrence, wait_settled

pytestmark = pytest.mark.acceptance

FAST = {
    "CLARION_CLAIM_LEASE": "3",
    "CLARION_STRAY_AFTER": "2",
    "CLARION_BATCH_SIZE": "50",
    "CLARION_TICK_INTERVAL": "0.5",
}


def _enqueue(items: list[dict], users: int) -> None:
    for u in range(users):
        register_recipient(f"u{u}", timezone="Europe/Berlin")
    for start in range(0, len(items), 500):
        notify_many(items[start : start + 500])


def _republish_some(rng: random.Random, count: int) -> None:
    """Re-publish route and deliver messages for existing rows, as a redelivering broker would."""
    with engine().connect() as conn:
        requests = conn.execute(text("SELECT user_id, id, lane FROM requests")).all()
        deliveries = conn.execute(text("SELECT user_id, id, lane FROM deliveries")).all()
    publish(ROUTE, rng.sample(requests, min(count, len(requests))))
    publish(DELIVER, rng.sample(deliveries, min(count, len(deliveries))))


def _assert_every_occurrence_once(receiver: Receiver, items: list[dict]) -> None:
    arrivals = receiver.arrivals
    expected = {occurrence(i) for i in items}
    assert set(arrivals.occurrences) == expected, "some occurrence never arrived, or a stranger did"
    split = [o for o, keys in arrivals.occurrences.items() if len(keys) != 1]
    assert split == [], f"occurrences that arrived under different idempotency keys: {split[:5]}"
    assert arrivals.rejected == 0
    assert counts("SELECT count(*) FROM deliveries WHERE state = 'sent'") == len(expected)
    assert counts("SELECT count(*) FROM deliveries WHERE state <> 'sent'") == 0


def _repeated_deliveries(receiver: Receiver) -> set[int]:
    a = receiver.arrivals
    return {a.deliveries[k] for k, n in a.by_key.items() if n > 1}  # type: ignore[misc]


def _incident_deliveries(kind: str) -> set[int]:
    with engine().connect() as conn:
        return set(
            conn.execute(
                text("SELECT delivery_id FROM incidents WHERE kind = :k"), {"k": kind}
            ).scalars()
        )


# A minute of SIGKILLs at full size: in the soak tier (CI runs it once, not in each pass).
@pytest.mark.soak
def test_ten_thousand_requests_survive_workers_killed_every_few_seconds(clarion_env, tmp_path):
    rng = random.Random(2026)
    users, per_user = 500, 20
    items = mixed_requests(users, per_user)  # 10,000 distinct occurrences
    repeats = rng.sample(items, len(items) // 10)  # repeated events ...
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        cluster = Cluster(
            {**clarion_env.env, **FAST, "CLARION_WEBHOOK_URL": receiver.url}, tmp_path / "logs"
        )
        workers = ["w1", "w2", "w3"]
        try:
            for name in workers:
                cluster.worker(name)
            cluster.beat()
            stop = threading.Event()
            kills: list[str] = []

            def chaos() -> None:
                while not stop.wait(rng.uniform(2.0, 4.0)):
                    victim = rng.choice(workers)
                    cluster.kill(victim)
                    kills.append(victim)
                    cluster.restart(victim)

            chaos_thread = threading.Thread(target=chaos, daemon=True)
            chaos_thread.start()
            _enqueue(items, users)
            again = notify_many(repeats)
            assert not any(e.new for e in again)
            _republish_some(rng, len(items) // 10)  # ... and re-published tasks: a fifth in all
            settled = wait_settled(240, expect_sent=len(items))
            stop.set()
            chaos_thread.join()
        finally:
            cluster.stop()
        assert settled, "the pipeline did not settle"
        assert len(kills) >= 3, f"chaos loop killed only {kills}"
        _assert_every_occurrence_once(receiver, items)
        # A worker killed between the provider's answer and "sent" causes a resend with the same key,
        # which the receiver answers 409: each such repeat is an incident, and every incident is one.
        repeated, incidents = _repeated_deliveries(receiver), _incident_deliveries("repeat")
        assert incidents <= repeated, "an incident that marks no repeat"
        assert len(repeated - incidents) <= len(kills), "repeats no incident records"
        assert not _incident_deliveries("outcome_unknown")
        print(
            f"\nkills={len(kills)} arrivals={receiver.arrivals.total} "
            f"unique={receiver.arrivals.unique} dropped_by_key={receiver.arrivals.repeats} "
            f"incidents={len(incidents)} precision={len(incidents & repeated) / max(1, len(incidents)):.2f}"
        )


def test_a_crash_after_the_send_resends_once_under_the_same_key(clarion_env, tmp_path):
    items = mixed_requests(20, 10)  # 200 occurrences
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        # one send in flight per process, each recorded before the next (no group commit), so
        # each crash leaves exactly one sent-but-unrecorded row (with more in flight, a crash can
        # leave up to CLARION_SEND_CONCURRENCY + CLARION_SENT_FLUSH_ROWS of them)
        env = {
            **clarion_env.env,
            **FAST,
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_SEND_CONCURRENCY": "1",
            "CLARION_SENT_FLUSH_ROWS": "1",
            "CLARION_FAULTS": "deliver.after_send=crash*3",
            "CLARION_FAULTS_DIR": str(tmp_path / "faults"),
        }
        cluster = Cluster(env, tmp_path / "logs")
        try:
            cluster.worker("w1")
            cluster.worker("w2")
            cluster.beat()
            _enqueue(items, 20)
            settled = wait_settled(120, expect_sent=len(items))
        finally:
            cluster.stop()
    assert settled
    assert len(list((tmp_path / "faults").iterdir())) == 3, (
        "the fault point did not fire three times"
    )
    _assert_every_occurrence_once(receiver, items)
    # Each crash happened after the receiver accepted a message and before "sent" was recorded, so
    # exactly three messages arrived twice, each time with the same idempotency key, which is what
    # let the receiver drop the repeat (409). Each of the three, and nothing else, is an incident.
    assert receiver.arrivals.repeats == 3
    repeated = _repeated_deliveries(receiver)
    assert len(repeated) == 3
    assert repeated == _incident_deliveries("repeat")
    assert counts("SELECT count(*) FROM incidents") == 3


def test_an_activation_backlog_does_not_delay_transactional(clarion_env, tmp_path):
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        env = {**clarion_env.env, **FAST, "CLARION_WEBHOOK_URL": receiver.url}
        cluster = Cluster(env, tmp_path / "logs")
        try:
            # The activation lane's worker is slowed to a crawl: every batch hangs one second.
            cluster.worker(
                "activation",
                ["activation"],
                concurrency=1,
                env={"CLARION_FAULTS": "deliver.after_claim=sleep:1"},
            )
            cluster.worker("transactional", ["transactional"], concurrency=1)
            cluster.worker("control", ["control"], concurrency=1)
            for u in range(100):
                register_recipient(f"u{u}", timezone="UTC")
            notify_many(
                [
                    dict(
                        user_id=f"u{u}",
                        type_key="nudge",
                        occurrence_key=f"n{n}",
                        variables={"name": "x"},
                    )
                    for u in range(100)
                    for n in range(30)
                ]
            )
            notify_many(
                [
                    dict(
                        user_id=f"u{u}",
                        type_key="receipt",
                        event_id=f"r{u}",
                        variables={"order": str(u)},
                    )
                    for u in range(100)
                ]
            )
            deadline = time.monotonic() + 60
            while (
                time.monotonic() < deadline
                and counts(
                    "SELECT count(*) FROM deliveries WHERE lane = 'transactional' AND state = 'sent'"
                )
                < 100
            ):
                time.sleep(0.2)
            transactional_sent = counts(
                "SELECT count(*) FROM deliveries WHERE lane = 'transactional' AND state = 'sent'"
            )
            activation_unsent = counts(
                "SELECT count(*) FROM requests r WHERE lane = 'activation' AND NOT EXISTS ("
                " SELECT 1 FROM deliveries d WHERE d.user_id = r.user_id AND d.request_id = r.id"
                " AND d.state = 'sent')"
            )
        finally:
            cluster.stop()
    assert transactional_sent == 100
    assert activation_unsent > 1000, "the activation backlog drained too fast to show anything"
