"""The receipt state machine (db.receipts) on real deliveries: each receipt a conditional update,
duplicates and reorderings harmless, unknown message ids kept and ignored, receipts that beat the
send's record applied by the tick, and the suppressions a bounce or complaint leaves behind.

Channel-independent: the deliveries here are webhook sends to the real receiver; each channel's
own tests feed the same machine from its provider's webhook."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from clarion import settings as clarion_settings
from clarion.db.engine import engine
from clarion.ops.explain import explain
from clarion.records import Receipt
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.receipts import ingest, replay_early
from clarion.tasks.route import route
from tests.support.endpoint import Call, Endpoint
from tests.support.pipeline import configure, drain, rows

pytestmark = pytest.mark.integration

AT = datetime(2026, 12, 1, 12, tzinfo=UTC)
Key = tuple[str, int]


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    with Receiver(clarion_settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        register_recipient("ann", timezone="UTC", addresses={"webhook": "https://hooks.example/a"})
        yield running


def requested(order: str) -> int:
    request = notify("ann", "receipt", event_id=order, variables={"order": order})
    assert route(["ann"], [request.request_id]) == 1  # routed, and sent if it has a channel
    drain("transactional")
    return request.request_id


def routed(order: str) -> Key:
    [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=requested(order))
    return row["user_id"], row["id"]


def sent(receiver: Receiver, order: str = "o1") -> Key:
    """A delivery the route task sent itself (in its process), once: counted at the receiver."""
    before = receiver.arrivals.total
    key = routed(order)
    assert state(key) == "sent" and message_id(key)
    assert receiver.arrivals.total == before + 1
    return key


def state(key: Key) -> str:
    return rows("SELECT state FROM deliveries WHERE id = :id", id=key[1])[0]["state"]


def message_id(key: Key) -> str:
    return rows("SELECT provider_message_id FROM deliveries WHERE id = :id", id=key[1])[0][
        "provider_message_id"
    ]


def receipt(key: Key, event: str, **kw) -> Receipt:
    return Receipt(
        channel="webhook", event=event, provider_message_id=message_id(key), occurred_at=AT, **kw
    )


def test_receipts_move_a_sent_delivery_forward_and_never_back(receiver):
    key = sent(receiver)
    assert ingest([receipt(key, "delivered")]) == {"applied": 1}
    assert ingest([receipt(key, "delivered")]) == {"repeated": 1}
    assert ingest([receipt(key, "clicked"), receipt(key, "opened")]) == {"applied": 1, "stale": 1}
    assert state(key) == "clicked"
    assert ingest([receipt(key, "bounced")]) == {"stale": 1}  # clicked mail did not bounce
    assert state(key) == "clicked"
    assert [r["outcome"] for r in rows("SELECT outcome FROM receipts ORDER BY id")] == [
        "applied",
        "repeated",
        "applied",
        "stale",
        "stale",
    ]


def test_a_hard_bounce_suppresses_the_address_and_the_next_notify_says_why(receiver):
    key = sent(receiver)
    assert ingest([receipt(key, "bounced", detail="550 5.1.1 no such user")]) == {"applied": 1}
    assert state(key) == "bounced"
    [row] = rows("SELECT channel, address, reason, detail FROM suppressions")
    assert (row["channel"], row["address"], row["reason"]) == (
        "webhook",
        "https://hooks.example/a",
        "bounced",
    )
    assert "550 5.1.1" in row["detail"]
    later = requested("o2")
    assert rows(
        "SELECT gate, reason FROM decisions WHERE request_id = :r AND outcome = 'suppress'", r=later
    ) == [
        {"gate": "suppression", "reason": "suppressed_address"},
        {"gate": "channels", "reason": "no_channel"},
    ]
    assert rows("SELECT id FROM deliveries WHERE request_id = :r", r=later) == []
    assert receiver.arrivals.total == 1  # counted at the receiver: the second never left
    told = explain("ann")
    assert "ann is on the suppression list for:" in told
    assert "https://hooks.example/a" in told and "bounced" in told
    assert "sent on webhook (bounced)" in told
    assert "receipt" in told and "550 5.1.1 no such user" in told


def test_a_soft_bounce_and_a_complaint_leave_the_right_traces(receiver):
    key = sent(receiver)
    assert ingest([receipt(key, "soft_bounced", detail="452 mailbox full")]) == {"applied": 1}
    assert state(key) == "sent" and rows("SELECT * FROM suppressions") == []
    ingest([receipt(key, "delivered"), receipt(key, "complained")])
    assert state(key) == "delivered"
    assert [r["reason"] for r in rows("SELECT reason FROM suppressions")] == ["complained"]


def test_a_receipt_for_a_message_clarion_never_sent_is_kept_and_ignored(receiver):
    key = sent(receiver)
    stray = Receipt(
        channel="webhook", event="delivered", provider_message_id="nope", occurred_at=AT
    )
    assert ingest([stray]) == {"unknown_message": 1}
    [kept] = rows("SELECT user_id, delivery_id, outcome FROM receipts")
    assert kept == {"user_id": "", "delivery_id": None, "outcome": "unknown_message"}
    wrong = Receipt(
        channel="email", event="bounced", provider_message_id=None, occurred_at=AT,
        user_id=key[0], delivery_id=key[1],
    )  # fmt: skip
    assert ingest([wrong]) == {"mismatch": 1}
    assert state(key) == "sent" and rows("SELECT * FROM suppressions") == []


def test_a_receipt_that_beats_the_record_of_its_send_is_applied_by_the_tick(receiver, monkeypatch):
    """The provider's receipt arrives while the route's own send is still in flight (the
    provider has the message; clarion has not recorded it): kept as early, applied later."""
    early_seen: list[tuple[dict, int]] = []

    def receipt_first(call: Call) -> int:
        early = Receipt(
            channel="webhook", event="delivered", provider_message_id=None, occurred_at=AT,
            user_id=call.payload["user_id"], delivery_id=call.payload["delivery_id"],
        )  # fmt: skip
        early_seen.append((ingest([early]), replay_early()))
        return 200

    with Endpoint(receipt_first) as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        key = routed("o1")
    assert endpoint.errors == [] and len(endpoint.calls) == 1
    assert early_seen == [({"early": 1}, 0)]  # still not sent when the receipt came
    assert state(key) == "sent"  # the route recorded its send
    assert deliver([key[0]], [key[1]]) == 0  # and nothing is left for a deliver task
    assert replay_early() == 1
    assert state(key) == "delivered"
    assert [r["outcome"] for r in rows("SELECT outcome FROM receipts")] == ["applied"]


# A provider's true history for one message, then its receipts as they may arrive: duplicated,
# in any order. The final state is the true history's, whatever the arrival order.
HISTORIES = {
    ("delivered",): "delivered",
    ("delivered", "opened"): "opened",
    ("delivered", "opened", "clicked"): "clicked",
    ("bounced",): "bounced",
    ("delivered", "bounced"): "bounced",  # accepted by the receiving server, bounced later
    ("failed",): "undelivered",
}


@st.composite
def arrivals(draw) -> tuple[tuple[str, ...], list[str]]:
    history = draw(st.sampled_from(sorted(HISTORIES)))
    extra = draw(st.lists(st.sampled_from(history), max_size=4))
    return history, draw(st.permutations([*history, *extra]))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=arrivals())
def test_duplicated_and_reordered_receipts_end_in_the_true_state(receiver, case):
    history, arrived = case
    if not rows("SELECT id FROM deliveries"):
        sent(receiver)
    [row] = rows("SELECT user_id, id FROM deliveries")
    key = (row["user_id"], row["id"])
    with engine().begin() as conn:  # each example starts from a fresh send of the same row
        conn.execute(text("UPDATE deliveries SET state = 'sent'"))
        conn.execute(text("DELETE FROM receipts"))
        conn.execute(text("DELETE FROM suppressions"))
    ingest([receipt(key, event) for event in arrived])
    assert state(key) == HISTORIES[history]
    suppressed = rows("SELECT reason FROM suppressions")
    assert suppressed == ([{"reason": "bounced"}] if "bounced" in history else [])
    outcomes = [r["outcome"] for r in rows("SELECT outcome FROM receipts")]
    assert len(outcomes) == len(arrived) and "applied" in outcomes  # every receipt kept
