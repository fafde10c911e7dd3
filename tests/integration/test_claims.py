"""Invariant 1 at the layer that implements it: the claim statement and the partial unique indexes."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from clarion import clock, settings
from clarion.db import claims, ledger
from clarion.db.engine import engine
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.endpoint import Call, Endpoint
from tests.support.pipeline import (
    configure,
    expire_lease,
    frozen_clock,
    published,
    publishing_to_this_tests_broker,
    rows,
)
from tests.support.race import held, race

LEASE = 60.0

pytestmark = pytest.mark.integration


def _pending_delivery(user: str = "u1", event: str = "e1") -> tuple[str, int]:
    """A routed request's pending delivery, as the tick hands one to the deliver task (a retry,
    a held row whose time came, a stray). Not made by the route task: on an unbudgeted lane it
    inserts its rows claimed and sends them itself (test_a_route_inserts_claimed_...), and the
    claim statement is what these tests are about. Written by the ledger's own statements."""
    register_recipient(user, timezone="Europe/Berlin")
    request = notify(user, "receipt", event_id=event, variables={"order": "A-1"})
    now = clock.now()
    with engine().begin() as conn:
        [routed] = ledger.resolve_requests(conn, [(user, request.request_id)], now=now)
        [created] = ledger.insert_deliveries(
            conn,
            [
                ledger.NewDelivery(
                    user,
                    request.request_id,
                    routed.type_key,
                    routed.occurrence_key,
                    "webhook",
                    False,
                    routed.lane,
                )
            ],
            now=now,
            due_at=now + timedelta(seconds=settings.get().stray_after),
        )
    assert created.lease_left is None and not created.held  # pending, for any claimer to take
    return user, created.id


def _claim(key: tuple[str, int], skew: float = 0.0, lease: float = LEASE) -> int:
    """Claim with a worker clock `skew` seconds off; returns the rows won."""
    now = clock.now() + timedelta(seconds=skew)
    with engine().begin() as conn:
        rows = claims.claim_deliveries(
            conn, [key], token=str(uuid.uuid4()), now=now, lease=lease, max_attempts=8
        )
    return len(rows)


def _waiting_on_locks() -> int:
    with engine().connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        ).scalar_one()


CLAIM = "UPDATE deliveries d SET state = 'claimed'"  # the claim statement's first line


def _row_held_until_queued(key: tuple[str, int], waiters: int):
    """The delivery's row, locked until `waiters` claimers queue on it: they then race at once."""
    lock = "SELECT 1 FROM deliveries WHERE user_id = :u AND id = :id FOR UPDATE"
    return held(lock, {"u": key[0], "id": key[1]}, waiters=waiters)


def test_sixteen_processes_racing_for_one_claim_get_exactly_one(clarion_env):
    key = _pending_delivery()
    with _row_held_until_queued(key, 16) as queued:
        results = race(16, _claim, lambda i: (key,))
    assert queued.waiters == 16 and queued.all_in(CLAIM), queued.statements  # they met there
    assert sorted(results) == [0] * 15 + [1]
    with engine().connect() as conn:
        state, attempts = conn.execute(text("SELECT state, attempts FROM deliveries")).one()
    assert (state, attempts) == ("claimed", 1)


def test_the_losers_wait_on_the_winners_row_lock_and_then_find_it_taken(clarion_env):
    """The winner's claim is held open (not committed); the others must block on its row lock —
    shown in pg_stat_activity — and, once it commits, claim nothing."""
    key = _pending_delivery()
    winner = engine().connect()
    won = claims.claim_deliveries(
        winner, [key], token=str(uuid.uuid4()), now=clock.now(), lease=LEASE, max_attempts=8
    )
    assert len(won) == 1
    seen_waiting: list[int] = []

    def commit_once_all_wait() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _waiting_on_locks() < 8:
            time.sleep(0.01)
        seen_waiting.append(_waiting_on_locks())
        winner.commit()

    releaser = threading.Thread(target=commit_once_all_wait)
    releaser.start()
    try:
        results = race(8, _claim, lambda i: (key,))
    finally:
        releaser.join()
        winner.close()
    assert seen_waiting == [8], "the other claimers never queued behind the winner's lock"
    assert results == [0] * 8
    with engine().connect() as conn:
        assert conn.execute(text("SELECT attempts FROM deliveries")).scalar_one() == 1


def test_a_lapsed_claim_is_taken_over_once_and_flagged(clarion_env):
    key = _pending_delivery()
    with engine().begin() as conn:
        first = claims.claim_deliveries(
            conn, [key], token=str(uuid.uuid4()), now=clock.now(), lease=LEASE, max_attempts=8
        )
    assert first and not first[0].taken_over and first[0].maybe_sent_at is None
    assert LEASE - 5 < first[0].lease_left <= LEASE  # the time left, on PostgreSQL's clock
    expire_lease(key)
    with _row_held_until_queued(key, 16) as queued:
        results = race(16, _claim, lambda i: (key,))
    assert queued.waiters == 16 and queued.all_in(CLAIM), queued.statements  # they met there
    assert sorted(results) == [0] * 15 + [1]
    with engine().connect() as conn:
        taken_over, attempts, owed = conn.execute(
            text("SELECT taken_over, attempts, maybe_sent_at FROM deliveries")
        ).one()
    assert taken_over and attempts == 2
    assert owed is None  # the first holder never reached the provider: nothing can have been sent


def test_workers_whose_clocks_differ_by_thirty_seconds_never_take_over_a_live_claim(clarion_env):
    """Leases are set and compared on PostgreSQL's clock: a worker 30 s ahead (injected) racing
    ones 30 s behind cannot see a live lease as lapsed; only a lease that really ran out moves."""
    key = _pending_delivery()
    assert _claim(key, skew=-30.0, lease=5.0) == 1  # the slow worker holds a 5 s lease
    results = race(8, _claim, lambda i: (key, 30.0 if i % 2 else -30.0))
    assert results == [0] * 8 and results.most_at_once() >= 2
    expire_lease(key)
    results = race(8, _claim, lambda i: (key, 30.0 if i % 2 else -30.0))
    assert sorted(results) == [0] * 7 + [1] and results.most_at_once() >= 2


def test_a_takeover_of_an_attempt_that_reached_the_provider_owes_a_reconcile(clarion_env):
    key = _pending_delivery()
    token = str(uuid.uuid4())
    with engine().begin() as conn:
        claims.claim_deliveries(
            conn, [key], token=token, now=clock.now(), lease=LEASE, max_attempts=8
        )
        lease = claims.begin_send(conn, key, token=token, need=90.0)
        assert (
            lease is not None and 85.0 < lease.left() <= 90.0
        )  # the lease now covers the whole send
        assert claims.begin_send(conn, key, token=str(uuid.uuid4()), need=90.0) is None
    expire_lease(key)
    with engine().begin() as conn:
        [taken] = claims.claim_deliveries(
            conn, [key], token=str(uuid.uuid4()), now=clock.now(), lease=LEASE, max_attempts=8
        )
    assert taken.taken_over and taken.maybe_sent_at is not None


def test_the_claim_refuses_rows_at_the_attempt_cap_and_takeovers_count(clarion_env):
    key = _pending_delivery()
    for attempt in range(3):
        assert _claim_capped(key, 3) == 1, f"claim {attempt + 1} of 3"
        expire_lease(key)
    assert _claim_capped(key, 3) == 0
    with engine().begin() as conn:
        [failed] = claims.exhaust_deliveries(conn, [key], now=clock.now(), max_attempts=3)
    assert failed["attempts"] == 3
    with engine().connect() as conn:
        assert conn.execute(text("SELECT state FROM deliveries")).scalar_one() == "failed"


def _claim_capped(key: tuple[str, int], cap: int) -> int:
    with engine().begin() as conn:
        return len(
            claims.claim_deliveries(
                conn, [key], token=str(uuid.uuid4()), now=clock.now(), lease=LEASE, max_attempts=cap
            )
        )


def test_the_claim_statement_survives_psycopg_auto_prepare(clarion_env):
    """psycopg prepares a statement after 5 runs on a connection; 50 runs must behave the same."""
    keys = [_pending_delivery("u1", f"e{n}") for n in range(50)]
    now = clock.now()
    with engine().connect() as conn:
        for key in keys:
            for _ in range(2):  # the second claim of the same row must lose, every time
                claims.claim_deliveries(
                    conn, [key], token=str(uuid.uuid4()), now=now, lease=LEASE, max_attempts=8
                )
            assert (
                claims.mark_sent(
                    conn,
                    key,
                    token="00000000-0000-0000-0000-000000000000",
                    platform="webhook",
                    message_id=None,
                    now=now,
                )
                is False
            )
            conn.commit()
        claimed = conn.execute(
            text("SELECT count(*) FROM deliveries WHERE state = 'claimed'")
        ).scalar()
    assert claimed == 50


def test_mark_sent_needs_the_current_token(clarion_env):
    key = _pending_delivery()
    now = clock.now()
    token = str(uuid.uuid4())
    with engine().begin() as conn:
        claims.claim_deliveries(conn, [key], token=token, now=now, lease=LEASE, max_attempts=8)
        assert not claims.mark_sent(
            conn, key, token=str(uuid.uuid4()), platform="webhook", message_id=None, now=now
        )
        assert claims.mark_sent(
            conn, key, token=token, platform="webhook", message_id="m1", now=now
        )
        assert not claims.mark_sent(
            conn, key, token=token, platform="webhook", message_id="m1", now=now
        )


def test_the_partial_index_refuses_a_second_sending_row_for_one_occurrence(clarion_env):
    """Even a row forged behind the planner's back cannot claim an occurrence already claimed."""
    user, delivery_id = _pending_delivery()
    assert _claim((user, delivery_id)) == 1
    other = notify(user, "receipt", event_id="other", variables={"order": "B"})
    forge = text(
        "INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel, one_platform,"
        " lane, state, claim_token, lease_until, not_before, created_at, updated_at)"
        " SELECT user_id, :r, type_key, occurrence_key, channel, false, lane, 'claimed',"
        " gen_random_uuid(), now(), now(), now(), now() FROM deliveries WHERE id = :id"
    )
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
        " NULL, NULL, now(), now(), now(), :channel, now() FROM deliveries WHERE channel = 'webhook'"
    )
    with engine().begin() as conn:
        conn.execute(
            text("UPDATE deliveries SET state = 'sent', platform = 'webhook', sent_at = now()")
        )
    with pytest.raises(IntegrityError, match="deliveries_one_platform"), engine().begin() as conn:
        conn.execute(insert, {"channel": "slack"})


def test_a_sent_row_must_name_its_platform(clarion_env):
    _pending_delivery()
    with (
        pytest.raises(IntegrityError, match="deliveries_sent_names_platform"),
        engine().begin() as conn,
    ):
        conn.execute(text("UPDATE deliveries SET state = 'sent'"))


def test_a_group_flush_records_only_the_rows_whose_claim_is_still_ours(clarion_env):
    """Group commit is conditional per row: a row taken over while its send waited for the
    group's statement is not marked by the old token; it becomes a possible_duplicate incident,
    and the rows still held are recorded by the same statement (>11 runs: prepared statements)."""
    from clarion.records import SendResult
    from clarion.tasks.send.group import Sent, SentGroup

    keys = [_pending_delivery(f"g{i}", f"e{i}") for i in range(14)]
    token = str(uuid.uuid4())
    now = clock.now()
    with engine().begin() as conn:
        held = claims.claim_deliveries(
            conn, keys, token=token, now=now, lease=LEASE, max_attempts=8
        )
    lost = sorted(held, key=lambda r: r.key)[:2]
    for row in lost:  # their lease ran out and another worker took them over
        expire_lease(row.key)
        assert _claim(row.key) == 1
    group = SentGroup(token, engine(), rows=1, wait=0.005)  # one statement per send: 14 runs
    for row in held:
        group.add(Sent(row, SendResult("webhook", f"m{row.id}"), now, time.monotonic() + 30, False))
    assert group.close() == len(keys) - 2
    with engine().connect() as conn:
        states = dict(
            conn.execute(text("SELECT state, count(*) FROM deliveries GROUP BY state")).all()
        )
        incidents = conn.execute(
            text("SELECT delivery_id, kind FROM incidents ORDER BY delivery_id")
        ).all()
    assert states == {"sent": len(keys) - 2, "claimed": 2}
    assert [tuple(i) for i in incidents] == [(r.id, "possible_duplicate") for r in lost]


def test_a_route_on_an_unbudgeted_lane_inserts_its_rows_claimed_and_sends_each_once(
    clarion_env, monkeypatch
):
    """The route task claims what it routes in the INSERT itself: every row not held back is
    written `claimed` under the task's one token, attempt 1, with a lease on PostgreSQL's clock
    (the worker's clock here is an hour behind), and sent in the same process. Seen from the
    receiver while each send is in flight; counted there. A second route or a deliver of the
    same keys finds nothing to send, and no deliver message was published."""
    lease = settings.get().claim_lease
    seen: list[list[dict]] = []

    def in_flight(call: Call) -> int:
        seen.append(
            rows(
                "SELECT id, state, claim_token, attempts, "
                "extract(epoch FROM lease_until - clock_timestamp()) AS lease_left "
                "FROM deliveries ORDER BY id"
            )
        )
        return 200

    with (
        Endpoint(in_flight) as endpoint,
        publishing_to_this_tests_broker(),
        frozen_clock(clock.now() - timedelta(hours=1)),
    ):
        configure(monkeypatch, webhook_url=endpoint.url, send_concurrency=1)
        register_recipient("u1", timezone="UTC")
        requests = [
            notify("u1", "receipt", event_id=f"e{n}", variables={"order": str(n)}) for n in range(3)
        ]
        published("transactional")  # notify's route messages; the test routes by hand
        ids = [r.request_id for r in requests]
        assert route(["u1"] * 3, ids) == 3
        keys = [("u1", r["id"]) for r in rows("SELECT id FROM deliveries ORDER BY id")]
        assert len(keys) == 3 and len(endpoint.calls) == 3  # sent by the route, at once
        assert sorted(c.payload["delivery_id"] for c in endpoint.calls) == [k[1] for k in keys]
        assert endpoint.errors == []
        first = seen[0]  # the first send (one sender): every row of the batch as inserted
        assert [r["id"] for r in first] == [k[1] for k in keys]
        assert [(r["state"], r["attempts"]) for r in first] == [("claimed", 1)] * 3
        assert len({r["claim_token"] for r in first}) == 1 and first[0]["claim_token"]
        for row in first:
            assert lease - 10 < row["lease_left"] <= lease  # PostgreSQL's clock, not the worker's
        tokens = {r["claim_token"] for s in seen for r in s if r["claim_token"] is not None}
        assert tokens == {first[0]["claim_token"]}  # the batch's token; nobody claimed again
        after = rows("SELECT state, attempts FROM deliveries ORDER BY id")
        assert after == [{"state": "sent", "attempts": 1}] * 3

        assert route(["u1"] * 3, ids) == 0  # resolved once: a second route changes nothing
        assert deliver([k[0] for k in keys], [k[1] for k in keys]) == 0  # nothing to claim
        assert len(endpoint.calls) == 3
        assert rows("SELECT state, attempts FROM deliveries ORDER BY id") == after
        assert published("transactional") == {}  # nothing for a deliver task to claim again
