"""Invariant 1 at the layer that implements it: the claim statement and the partial unique indexes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from clarion import clock
from db import ledger
from db.engine import engine
from tasks import notify, register_recipient
from tasks.route import route
from tests.support.race import race

pytestmark = pytest.mark.integration


def _routed_delivery(user: str = "u1", event: str = "e1") -> tuple[str, int]:
    register_recipient(user, timezone="Europe/Berlin")
    request = notify(user, "receipt", event_id=event, variables={"order": "A-1"})
    route([user], [request.request_id])
    with engine().connect() as conn:
        return user, conn.execute(text("SELECT id FROM deliveries WHERE user_id = :u"), {"u": user}).scalar_one()


def _claim(key: tuple[str, int]) -> int:
    now = clock.now()
    with engine().begin() as conn:
        rows = ledger.claim_deliveries(conn, [key], token=str(uuid.uuid4()), now=now,
                                       lease_until=now + timedelta(seconds=60))
    return len(rows)


def test_sixteen_processes_racing_for_one_claim_get_exactly_one(clarion_env):
    key = _routed_delivery()
    results = race(16, _claim, lambda i: (key,))
    assert sorted(results) == [0] * 15 + [1]
    with engine().connect() as conn:
        state, attempts = conn.execute(text("SELECT state, attempts FROM deliveries")).one()
    assert (state, attempts) == ("claimed", 1)


def test_a_lapsed_claim_is_taken_over_once_and_flagged(clarion_env):
    key = _routed_delivery()
    start = clock.now()
    with engine().begin() as conn:
        first = ledger.claim_deliveries(conn, [key], token=str(uuid.uuid4()), now=start,
                                        lease_until=start + timedelta(seconds=5))
    assert first and not first[0]["taken_over"]
    later = start + timedelta(seconds=6)
    clock.set_source(lambda: later)
    try:
        results = race(16, _claim, lambda i: (key,))
    finally:
        clock.set_source(None)
    assert sorted(results) == [0] * 15 + [1]
    with engine().connect() as conn:
        taken_over, attempts = conn.execute(text("SELECT taken_over, attempts FROM deliveries")).one()
    assert taken_over and attempts == 2


def test_the_claim_statement_survives_psycopg_auto_prepare(clarion_env):
    """psycopg prepares a statement after 5 runs on a connection; 50 runs must behave the same."""
    register_recipient("u1", timezone="UTC")
    keys = []
    for n in range(50):
        request = notify("u1", "receipt", event_id=f"e{n}", variables={"order": str(n)})
        route(["u1"], [request.request_id])
    with engine().connect() as conn:
        keys = [("u1", i) for i in conn.execute(text("SELECT id FROM deliveries ORDER BY id")).scalars()]
    now = clock.now()
    with engine().connect() as conn:
        for key in keys:
            for _ in range(2):  # the second claim of the same row must lose, every time
                ledger.claim_deliveries(conn, [key], token=str(uuid.uuid4()), now=now,
                                        lease_until=now + timedelta(seconds=60))
            assert ledger.mark_sent(conn, key, token="00000000-0000-0000-0000-000000000000",
                                    platform="webhook", message_id=None, now=now) is False
            conn.commit()
        claimed = conn.execute(text("SELECT count(*) FROM deliveries WHERE state = 'claimed'")).scalar()
    assert claimed == 50


def test_mark_sent_needs_the_current_token(clarion_env):
    key = _routed_delivery()
    now = clock.now()
    token = str(uuid.uuid4())
    with engine().begin() as conn:
        ledger.claim_deliveries(conn, [key], token=token, now=now, lease_until=now + timedelta(seconds=60))
        assert not ledger.mark_sent(conn, key, token=str(uuid.uuid4()), platform="webhook",
                                    message_id=None, now=now)
        assert ledger.mark_sent(conn, key, token=token, platform="webhook", message_id="m1", now=now)
        assert not ledger.mark_sent(conn, key, token=token, platform="webhook", message_id="m1", now=now)


def test_the_partial_index_refuses_a_second_sending_row_for_one_occurrence(clarion_env):
    """Even a row forged behind the planner's back cannot claim an occurrence already claimed."""
    user, delivery_id = _routed_delivery()
    assert _claim((user, delivery_id)) == 1
    other = notify(user, "receipt", event_id="other", variables={"order": "B"})
    forge = text(
        "INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel, one_platform,"
        " lane, state, claim_token, lease_until, not_before, created_at, updated_at)"
        " SELECT user_id, :r, type_key, occurrence_key, channel, false, lane, 'claimed',"
        " gen_random_uuid(), now(), now(), now(), now() FROM deliveries WHERE id = :id")
    with pytest.raises(IntegrityError, match="deliveries_one_send"), engine().begin() as conn:
        conn.execute(forge, {"r": other.request_id, "id": delivery_id})


def test_one_platform_types_hold_one_sending_row_across_channels(clarion_env):
    register_recipient("u1", timezone="UTC")
    request = notify("u1", "nudge", event_id="n1", variables={"name": "Ann"})
    route(["u1"], [request.request_id])
    insert = text(
        "INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel, one_platform,"
        " lane, state, claim_token, lease_until, not_before, created_at, updated_at, platform, sent_at)"
        " SELECT user_id, request_id, type_key, occurrence_key, :channel, true, lane, 'sent',"
        " NULL, NULL, now(), now(), now(), :channel, now() FROM deliveries WHERE channel = 'webhook'")
    with engine().begin() as conn:
        conn.execute(text("UPDATE deliveries SET state = 'sent', platform = 'webhook', sent_at = now()"))
    with pytest.raises(IntegrityError, match="deliveries_one_platform"), engine().begin() as conn:
        conn.execute(insert, {"channel": "slack"})


def test_a_sent_row_must_name_its_platform(clarion_env):
    _routed_delivery()
    with pytest.raises(IntegrityError, match="deliveries_sent_names_platform"), engine().begin() as conn:
        conn.execute(text("UPDATE deliveries SET state = 'sent'"))
