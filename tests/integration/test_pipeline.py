"""The pipeline in-process against real PostgreSQL and Redis: outbox, route, deliver, retries,
fault points and the sweeper. Time is driven by an injected clock; every test asserts on rows.

Celery tasks run as plain functions here. What they publish stays in the Redis broker (no worker
runs), so a test can read exactly which keys were published with `published`. The route task sends
what it routes itself, in-process (every lane here is unbudgeted): no deliver message follows a
route; the deliver task runs for what the tick republishes (retries, lapsed leases, strays).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from clarion import clock, settings
from clarion.db import claims
from clarion.db.engine import engine
from clarion.errors import FaultInjected
from clarion.records import idempotency_key
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, notify_many, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.publish import DELIVER, ROUTE
from clarion.tasks.route import route
from clarion.tasks.tick import tick
from tests.support.endpoint import Endpoint
from tests.support.pipeline import (
    configure,
    count,
    drain,
    expire_lease,
    frozen_clock,
    published,
    publishing_to_this_tests_broker,
    rows,
)
from tests.support.race import held, race

pytestmark = pytest.mark.integration

ORDER = {"order": "A-1"}
LANE = "transactional"  # the lane of every type used here
NOTHING = {"requests": 0, "deliveries": 0}

Key = tuple[str, int]


@pytest.fixture(autouse=True)
def _broker(clarion_env) -> Iterator[None]:
    """Publish to this test's Redis (see publishing_to_this_tests_broker for why it may not)."""
    with publishing_to_this_tests_broker():
        yield


@pytest.fixture
def ann(clarion_env) -> str:
    register_recipient("ann", timezone="Europe/Berlin")
    return "ann"


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    """The real webhook receiver, as the default webhook URL."""
    with Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        yield running


def _catalog(tmp_path: Path, source: str, edit: Callable[[dict], None]) -> Path:
    """A copy of the test catalog with `edit` applied to its types."""
    data = yaml.safe_load(Path(source).read_text())
    edit(data["types"])
    path = tmp_path / f"catalog-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _receipt_v1_only(types: dict) -> None:
    types["receipt"]["templates"] = [t for t in types["receipt"]["templates"] if t["version"] == 1]


def _routed(user: str, event: str = "e1") -> Key:
    """Notify and route one receipt, which the route sends itself (no deliver message is
    published for it); returns the key of its one delivery."""
    request = notify(user, "receipt", event_id=event, variables=ORDER)
    assert route([user], [request.request_id]) == 1
    [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request.request_id)
    # drop what notify published; tests read what follows
    assert [task for task, _, _ in drain(LANE) if task == DELIVER] == []
    return row["user_id"], row["id"]


def _unsent(user: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Key, str]:
    """Notify and route one receipt whose route stops after its commit, before its send (a
    process that died there): the delivery is claimed under the route's token, nothing sent.
    Returns its key and that token."""
    configure(monkeypatch, faults="route.after_commit=raise")
    request = notify(user, "receipt", event_id="e1", variables=ORDER)
    with pytest.raises(FaultInjected, match=r"^route\.after_commit$"):
        route([user], [request.request_id])
    configure(monkeypatch, faults=None)
    [row] = rows("SELECT user_id, id, state, attempts, claim_token FROM deliveries")
    assert (row["state"], row["attempts"]) == ("claimed", 1)
    assert published(LANE)[DELIVER] == []
    return (row["user_id"], row["id"]), str(row["claim_token"])


def _retrying(user: str, events: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Notify and route receipts in one batch whose route's sends all get a transient 408: each
    delivery goes back to pending, its retry due after the policy's base wait (about 2 s)."""
    made = notify_many(
        [dict(user_id=user, type_key="receipt", event_id=e, variables=ORDER) for e in events]
    )
    with Endpoint(lambda call: 408) as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        assert route([user] * len(made), [m.request_id for m in made]) == len(made)
    assert len(endpoint.calls) == len(made)
    assert count("deliveries", "state = 'pending' AND attempts = 1") == len(made)
    assert [task for task, _, _ in drain(LANE) if task == DELIVER] == []  # drops notify's


def _tick() -> dict[str, int]:
    """What a beat tick took of the work these tests make (it may report other kinds too)."""
    taken = tick()
    return {"requests": taken["requests"], "deliveries": taken["deliveries"]}


def _deliver(*keys: Key) -> int:
    return deliver([k[0] for k in keys], [k[1] for k in keys])


def _delivery() -> dict:
    [row] = rows(
        "SELECT state, platform, attempts, taken_over, claim_token, lease_until, not_before,"
        " due_at, last_error, provider_message_id, sent_at, maybe_sent_at FROM deliveries"
    )
    return row


def _decisions() -> list[dict]:
    return rows(
        "SELECT request_id, delivery_id, channel, gate, outcome, reason, detail"
        " FROM decisions ORDER BY id"
    )


# --- outbox ----------------------------------------------------------------------------------


def test_an_outbox_request_rolled_back_with_the_callers_transaction_leaves_no_row(ann):
    class CallerFailed(Exception):
        pass

    with (
        pytest.raises(CallerFailed, match=r"^the caller failed after notify$"),
        engine().begin() as conn,
    ):
        notify(ann, "receipt", event_id="e1", variables=ORDER, connection=conn)
        raise CallerFailed("the caller failed after notify")
    assert count("requests") == 0
    assert _tick() == NOTHING
    assert published(LANE)[ROUTE] == []


def test_an_outbox_request_committed_by_the_caller_is_routed_after_the_next_tick(
    clarion_env, receiver
):
    with frozen_clock() as clk:
        with engine().begin() as conn:
            register_recipient("cat", timezone="UTC", connection=conn)
            enqueued = notify("cat", "receipt", event_id="e1", variables=ORDER, connection=conn)
            assert count("requests") == 0  # invisible to everyone else until the caller commits
        assert published(LANE)[ROUTE] == []  # the outbox path never publishes itself
        assert rows("SELECT id, state, due_at FROM requests") == [
            {"id": enqueued.request_id, "state": "pending", "due_at": clk.now}
        ]

        assert _tick() == {"requests": 1, "deliveries": 0}
        assert published(LANE)[ROUTE] == [("cat", enqueued.request_id)]
        assert _tick() == NOTHING  # taken rows are pushed ahead: the next tick leaves them alone

        assert route(["cat"], [enqueued.request_id]) == 1
        assert rows("SELECT state, due_at FROM requests") == [{"state": "routed", "due_at": None}]
        # the route sent its delivery itself: recorded sent, taken once, nothing published
        assert count("deliveries", "request_id = :r AND state = 'sent'", r=enqueued.request_id) == 1
        assert receiver.arrivals.total == 1 and published(LANE)[DELIVER] == []
        clk.advance(3600)
        assert _tick()["requests"] == 0  # a routed request never comes round again


# --- route -----------------------------------------------------------------------------------


def test_routing_a_request_twice_creates_its_deliveries_once(ann, receiver):
    request = notify(ann, "two_channels", event_id="e1")
    ids = [request.request_id]
    assert route([ann], ids) == 1
    assert route([ann], ids) == 0
    assert route([ann, ann], ids * 2) == 0
    deliveries = rows("SELECT id, channel, state, attempts FROM deliveries ORDER BY channel")
    # the first route sent both itself, once each; the repeats neither created nor sent anything
    assert [(d["channel"], d["state"], d["attempts"]) for d in deliveries] == [
        ("console", "sent", 1),
        ("webhook", "sent", 1),
    ]
    assert receiver.arrivals.total == 1
    assert published(LANE)[DELIVER] == []
    assert _decisions() == []


def _route_one(user: str, request_id: int) -> int:
    return route([user], [request_id])


def test_eight_processes_routing_one_request_resolve_it_once(ann, receiver):
    request = notify(ann, "two_channels", event_id="e1")
    # the request's row is held until all eight routes queue on it: then they race for it at once
    lock = "SELECT 1 FROM requests WHERE user_id = :u AND id = :id FOR UPDATE"
    with held(lock, {"u": ann, "id": request.request_id}, waiters=8) as queued:
        results = race(8, _route_one, lambda i: (ann, request.request_id))
    assert queued.waiters == 8 and queued.all_in("UPDATE requests r SET state"), (
        queued.statements
    )  # they met there
    assert sorted(results) == [0] * 7 + [1]
    assert count("deliveries") == 2
    # the one process that routed it sent both deliveries itself, once; nothing was published
    assert count("deliveries", "state = 'sent' AND attempts = 1") == 2
    assert receiver.arrivals.total == 1
    assert published(LANE)[DELIVER] == []


def test_a_channel_without_an_adapter_is_a_recorded_decision_not_a_delivery(ann):
    request = notify(ann, "emailed", event_id="e1")
    assert route([ann], [request.request_id]) == 1
    assert count("deliveries") == 0
    assert rows("SELECT state FROM requests") == [{"state": "routed"}]
    decisions = _decisions()
    assert [
        (d["request_id"], d["delivery_id"], d["outcome"], d["reason"])
        for d in decisions
        if d["channel"] == "email"
    ] == [(request.request_id, None, "suppress", "no_adapter")]
    assert route([ann], [request.request_id]) == 0
    assert _decisions() == decisions  # a repeated route records nothing twice


def test_a_type_this_worker_lacks_waits_for_a_worker_that_has_it(
    ann, clarion_env, receiver, monkeypatch, tmp_path
):
    """A rolling deploy: the producer's catalog has a type an older worker's does not."""
    request = notify(ann, "security_code", event_id="e1", variables={"code": "123"})
    full = clarion_env.env["CLARION_CATALOG"]
    configure(
        monkeypatch, catalog=_catalog(tmp_path, full, lambda types: types.pop("security_code"))
    )
    assert route([ann], [request.request_id]) == 0
    [waiting] = rows("SELECT state, due_at > now() AS later FROM requests")
    assert waiting == {"state": "pending", "later": True} and _decisions() == []
    configure(monkeypatch, catalog=full)  # the newer worker takes it
    assert route([ann], [request.request_id]) == 1
    assert count("deliveries", "state = 'sent'") == 1 and _decisions() == []
    assert receiver.arrivals.total == 1


def test_a_type_gone_from_the_catalog_past_the_grace_is_a_recorded_decision(
    ann, clarion_env, monkeypatch, tmp_path
):
    request = notify(ann, "security_code", event_id="e1", variables={"code": "123"})
    configure(
        monkeypatch,
        catalog_skew_grace=0.001,
        catalog=_catalog(
            tmp_path, clarion_env.env["CLARION_CATALOG"], lambda types: types.pop("security_code")
        ),
    )
    assert route([ann], [request.request_id]) == 1
    assert count("deliveries") == 0
    assert [(d["gate"], d["outcome"], d["reason"]) for d in _decisions()] == [
        ("catalog", "suppress", "unknown_type")
    ]


def test_the_template_version_is_pinned_when_the_request_is_made(
    ann, clarion_env, monkeypatch, tmp_path
):
    configure(
        monkeypatch,
        catalog=_catalog(tmp_path, clarion_env.env["CLARION_CATALOG"], _receipt_v1_only),
    )
    old = notify(ann, "receipt", event_id="old", variables=ORDER)
    configure(monkeypatch, catalog=clarion_env.env["CLARION_CATALOG"])  # v2 is published
    new = notify(ann, "receipt", event_id="new", variables=ORDER)
    assert route([ann, ann], [old.request_id, new.request_id]) == 2
    assert rows("SELECT id, template_version FROM requests ORDER BY id") == [
        {"id": old.request_id, "template_version": 1},
        {"id": new.request_id, "template_version": 2},
    ]


# --- deliver ---------------------------------------------------------------------------------


def test_a_route_sends_once_over_the_webhook_and_records_the_send(ann, receiver):
    key = _routed(ann)  # the route sends it itself
    row = _delivery()
    assert {
        k: row[k]
        for k in (
            "state",
            "platform",
            "attempts",
            "taken_over",
            "claim_token",
            "lease_until",
            "due_at",
            "last_error",
            "provider_message_id",
        )
    } == {
        "state": "sent",
        "platform": "webhook",
        "attempts": 1,
        "taken_over": False,
        "claim_token": None,
        "lease_until": None,
        "due_at": None,
        "last_error": None,
        "provider_message_id": str(key[1]),
    }
    assert row["sent_at"] is not None
    assert dict(receiver.arrivals.by_key) == {
        idempotency_key(ann, "receipt", "event:e1", "webhook"): 1
    }

    assert _deliver(key) == 0  # a stray deliver message: the claim finds nothing to take
    assert _deliver(key, key) == 0
    assert receiver.arrivals.total == 1
    assert _delivery()["attempts"] == 1
    assert count("incidents") == 0


def test_a_request_renders_the_template_version_it_pinned(ann, clarion_env, monkeypatch, tmp_path):
    configure(
        monkeypatch,
        catalog=_catalog(tmp_path, clarion_env.env["CLARION_CATALOG"], _receipt_v1_only),
    )
    old = notify(ann, "receipt", event_id="old", variables=ORDER)  # pins v1
    configure(monkeypatch, catalog=clarion_env.env["CLARION_CATALOG"])  # now with v1 and v2
    new = notify(ann, "receipt", event_id="new", variables=ORDER)  # pins v2
    with Endpoint() as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        # routed together by a worker that has both versions, and sent by the route itself
        assert route([ann, ann], [old.request_id, new.request_id]) == 2
    assert count("deliveries", "state = 'sent'") == 2
    content = {c.payload["occurrence_key"]: c.payload["content"] for c in endpoint.calls}
    assert content == {
        "event:old": {"title": "Receipt A-1", "body": "Thanks for order A-1."},
        "event:new": {"title": "Your receipt A-1", "body": "Thanks for order A-1."},
    }


def test_a_pinned_version_this_worker_lacks_waits_with_its_attempt_refunded(
    ann, clarion_env, monkeypatch, tmp_path
):
    request = notify(ann, "receipt", event_id="e1", variables=ORDER)  # pins v2
    configure(
        monkeypatch,
        catalog=_catalog(tmp_path, clarion_env.env["CLARION_CATALOG"], _receipt_v1_only),
    )
    with Endpoint() as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        # an old worker routes it; its own send lacks v2: the row waits, its attempt refunded
        assert route([ann], [request.request_id]) == 1
        [row] = rows("SELECT user_id, id, state, attempts FROM deliveries")
        assert (row["state"], row["attempts"]) == ("pending", 0)
        key = (row["user_id"], row["id"])
        for _ in range(20):  # however often an old worker gets it, it costs no attempt
            assert _deliver(key) == 0
            with engine().begin() as conn:
                conn.execute(text("UPDATE deliveries SET not_before = now()"))
        row = _delivery()
        assert (row["state"], row["attempts"]) == ("pending", 0)
        assert row["last_error"].startswith("template_missing")
        configure(monkeypatch, catalog=clarion_env.env["CLARION_CATALOG"])  # a newer worker
        assert _deliver(key) == 1
    assert len(endpoint.calls) == 1 and _decisions() == []


def test_a_pinned_version_gone_past_the_grace_fails_the_delivery_with_a_reason(
    ann, clarion_env, monkeypatch, tmp_path
):
    request = notify(ann, "receipt", event_id="e1", variables=ORDER)  # pins v2
    configure(
        monkeypatch,
        catalog_skew_grace=0.001,
        catalog=_catalog(tmp_path, clarion_env.env["CLARION_CATALOG"], _receipt_v1_only),
    )
    with Endpoint() as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        assert route([ann], [request.request_id]) == 1  # and its own send lacks v2, for good
        [row] = rows("SELECT user_id, id FROM deliveries")
        key = (row["user_id"], row["id"])
        assert _deliver(key) == 0
    assert endpoint.calls == []
    assert _delivery()["state"] == "failed"
    assert [(d["delivery_id"], d["gate"], d["outcome"], d["reason"]) for d in _decisions()] == [
        (key[1], "deliver", "failed", "template_missing")
    ]


def test_a_slow_batch_sends_a_row_whose_lease_lapsed_but_not_one_another_worker_took(
    ann, monkeypatch
):
    """A thread reaches its later rows late. A lapsed lease nobody took is still ours (the
    conditional update on the token proves it, and extends the lease); a row a rival claimed
    meanwhile is left to the rival, unsent. (The claim's lease is shorter than a send's budget, so
    every send asks PostgreSQL first; with a longer lease a webhook send skips that question.)"""
    configure(monkeypatch, send_concurrency=1, claim_lease=10)  # one send after another
    made = notify_many(
        [dict(user_id=ann, type_key="receipt", event_id=f"e{n}", variables=ORDER) for n in range(3)]
    )

    def slow_provider(call) -> int:
        if call.payload["occurrence_key"] == "event:e0":  # while the first send is in flight ...
            keys = [
                (r["user_id"], r["id"])
                for r in rows("SELECT user_id, id FROM deliveries ORDER BY id")
            ]
            for key in keys[1:]:
                expire_lease(key)
            with engine().begin() as conn:  # ... a rival takes the third row
                assert claims.claim_deliveries(
                    conn,
                    [keys[2]],
                    token=str(uuid.uuid4()),
                    now=clock.now(),
                    lease=60,
                    max_attempts=8,
                )
        return 200

    with Endpoint(slow_provider) as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        # one route batch: its rows are inserted claimed, and the route sends them one by one
        assert route([ann] * 3, [m.request_id for m in made]) == 3
    assert endpoint.errors == []
    assert [c.payload["occurrence_key"] for c in endpoint.calls] == ["event:e0", "event:e1"]
    assert [r["state"] for r in rows("SELECT state FROM deliveries ORDER BY id")] == [
        "sent",
        "sent",
        "claimed",
    ]
    assert count("incidents") == 0


# --- retries and failures ----------------------------------------------------------------------


def test_a_transient_failure_releases_the_claim_and_the_sweeper_retries_it(ann, monkeypatch):
    answers = iter([408, 200])
    with (
        frozen_clock(datetime.now(UTC) + timedelta(days=1)) as clk,
        Endpoint(lambda call: next(answers)) as endpoint,
    ):
        configure(monkeypatch, webhook_url=endpoint.url)
        start = clk.now
        key = _routed(ann)  # the route's own send gets the 408
        row = _delivery()
        assert (row["state"], row["claim_token"], row["lease_until"], row["attempts"]) == (
            "pending",
            None,
            None,
            1,
        )
        assert row["not_before"] == row["due_at"]
        wait = (row["not_before"] - start).total_seconds()
        assert 2 * 0.8 <= wait <= 2 * 1.2  # the policy's base, with jitter
        assert row["last_error"].startswith("http_408")
        assert row["maybe_sent_at"] is None  # a 408: the receiver did not take it

        assert _deliver(key) == 0  # a message that arrives early cannot claim before not_before
        assert _tick() == NOTHING
        assert _delivery()["attempts"] == 1

        clk.advance(2.5)
        assert _tick() == {"requests": 0, "deliveries": 1}
        assert published(LANE)[DELIVER] == [key]
        assert _deliver(key) == 1
    row = _delivery()
    assert (row["state"], row["attempts"], row["last_error"]) == ("sent", 2, None)
    assert len(endpoint.calls) == 2
    assert _decisions() == [] and count("incidents") == 0


def test_a_permanent_rejection_fails_the_delivery_with_a_recorded_reason(ann, monkeypatch):
    with frozen_clock() as clk:
        with Endpoint(lambda call: 404) as endpoint:
            configure(monkeypatch, webhook_url=endpoint.url)
            key = _routed(ann)  # the route's own send is rejected
            request_id = rows("SELECT id FROM requests")[0]["id"]
            assert _deliver(key) == 0  # a stray deliver message changes nothing
            assert _deliver(key) == 0
        assert len(endpoint.calls) == 1
        row = _delivery()
        assert (row["state"], row["claim_token"], row["due_at"], row["attempts"]) == (
            "failed",
            None,
            None,
            1,
        )
        assert row["last_error"].startswith("http_404")
        [decision] = _decisions()
        assert {
            k: decision[k]
            for k in ("request_id", "delivery_id", "channel", "gate", "outcome", "reason")
        } == {
            "request_id": request_id,
            "delivery_id": key[1],
            "channel": "webhook",
            "gate": "deliver",
            "outcome": "failed",
            "reason": "http_404",
        }
        clk.advance(3600)
        assert _tick() == NOTHING  # failed is final


def test_a_bad_signature_is_refused_by_the_receiver_and_fails_for_good(ann, receiver, monkeypatch):
    configure(monkeypatch, webhook_secret="not-the-receivers-secret")
    key = _routed(ann)  # the route's own send is refused
    assert _deliver(key) == 0  # and nothing is left to claim
    assert (receiver.arrivals.rejected, receiver.arrivals.total) == (1, 0)
    assert _delivery()["state"] == "failed"
    assert [(d["gate"], d["outcome"], d["reason"]) for d in _decisions()] == [
        ("deliver", "failed", "http_401")
    ]


def test_a_delivery_fails_with_retries_exhausted_after_max_attempts(ann, receiver, monkeypatch):
    configure(monkeypatch, max_attempts=2)
    receiver.arrivals.fail_next = 5
    with frozen_clock() as clk:
        key = _routed(ann)  # the route's own send: the first attempt, refused
        assert _deliver(key) == 0  # its retry is not due yet
        assert _delivery()["state"] == "pending"
        clk.advance(3)
        assert _tick()["deliveries"] == 1
        assert _deliver(key) == 0
        clk.advance(3600)
        assert _tick() == NOTHING
        assert _deliver(key) == 0
    row = _delivery()
    assert (row["state"], row["attempts"]) == ("failed", 2)
    [decision] = _decisions()
    assert (decision["gate"], decision["outcome"], decision["reason"]) == (
        "deliver",
        "failed",
        "retries_exhausted",
    )
    assert decision["detail"].startswith("http_503")
    assert receiver.arrivals.fail_next == 3  # two attempts reached the receiver, no more
    assert receiver.arrivals.total == 0


# --- fault points: crash windows ------------------------------------------------------------------


def test_an_error_after_the_send_is_an_unknown_outcome_resent_under_the_same_key(
    ann, receiver, monkeypatch
):
    configure(monkeypatch, faults="deliver.after_send=raise*1")
    with frozen_clock(datetime.now(UTC) + timedelta(days=1)) as clk:
        # the route's own send: sent, then an error before "sent" was recorded, caught on the row
        key = _routed(ann)
        assert _deliver(key) == 0  # its resend is not due yet
        row = _delivery()
        assert (row["state"], row["attempts"], row["claim_token"]) == ("pending", 1, None)
        assert row["maybe_sent_at"] is not None and row["last_error"].startswith("internal_error")
        assert receiver.arrivals.total == 1  # the provider has it; the ledger does not know
        clk.advance(3)
        assert _tick() == {"requests": 0, "deliveries": 1}
        assert _deliver(key) == 1
    row = _delivery()
    assert (row["state"], row["attempts"], row["maybe_sent_at"]) == ("sent", 2, None)
    arrivals = receiver.arrivals
    assert (arrivals.total, arrivals.unique, arrivals.repeats) == (2, 1, 1)
    assert set(arrivals.by_key) == {idempotency_key(ann, "receipt", "event:e1", "webhook")}
    # the receiver answered 409 to the repeat: a repeat that did happen (and was dropped by key)
    assert [
        r["kind"] for r in rows("SELECT kind FROM incidents WHERE delivery_id = :d", d=key[1])
    ] == ["repeat"]


def _dead_worker(key: Key, token: str, *, posted: bool) -> None:
    """The route that claimed `key` under `token` reached the send (and, if `posted`, the
    provider), then died."""
    with engine().begin() as conn:
        assert claims.begin_send(conn, key, token=token, need=30) is not None
    [row] = rows("SELECT id, user_id, type_key, occurrence_key, attempts FROM deliveries")
    if posted:
        from clarion.records import Message
        from clarion.tasks import runtime

        runtime.adapters()["webhook"].send(
            Message(
                delivery_id=row["id"],
                user_id=row["user_id"],
                type_key=row["type_key"],
                occurrence_key=row["occurrence_key"],
                channel="webhook",
                content={"title": "t"},
                attempt=row["attempts"],
            )
        )


@pytest.mark.parametrize("posted", [True, False])
def test_a_takeover_resends_under_the_key_and_an_incident_only_marks_a_real_repeat(
    ann, receiver, monkeypatch, posted
):
    key, token = _unsent(ann, monkeypatch)
    _dead_worker(key, token, posted=posted)
    assert _tick() == NOTHING  # the lease still stands
    assert _deliver(key) == 0  # and no one else may claim meanwhile
    expire_lease(key)
    assert _tick() == {"requests": 0, "deliveries": 1}
    assert published(LANE)[DELIVER] == [key]
    assert _deliver(key) == 1
    row = _delivery()
    assert (row["state"], row["attempts"], row["taken_over"]) == ("sent", 2, True)
    assert receiver.arrivals.total == (2 if posted else 1) and receiver.arrivals.unique == 1
    kinds = [r["kind"] for r in rows("SELECT kind FROM incidents")]
    assert kinds == (["repeat"] if posted else [])


def test_a_claim_taken_over_cannot_be_settled_with_the_old_token(ann, monkeypatch):
    key, first = _unsent(ann, monkeypatch)  # the first claim: the route's, which sent nothing
    second = str(uuid.uuid4())
    now = clock.now()
    expire_lease(key)
    with engine().begin() as conn:
        [taken] = claims.claim_deliveries(
            conn, [key], token=second, now=now, lease=5, max_attempts=8
        )
        assert taken.taken_over
        assert claims.begin_send(conn, key, token=first, need=10) is None
        assert claims.mark_sent(
            conn, key, token=second, platform="webhook", message_id="b", now=now
        )
    with engine().begin() as conn:
        assert not claims.mark_sent(
            conn, key, token=first, platform="webhook", message_id="a", now=now
        )
        assert not claims.release_claim(conn, key, token=first, not_before=now, error="x", now=now)
        assert not claims.hold_unknown(conn, key, token=first, error="x", now=now)
        assert claims.fail_delivery(conn, key, token=first, error="x", now=now) is None
    row = _delivery()
    assert (row["state"], row["provider_message_id"], row["attempts"]) == ("sent", "b", 2)


def test_a_worker_whose_claim_was_taken_during_the_send_records_a_possible_duplicate(
    ann, monkeypatch
):
    """The provider is slow: meanwhile the lease of the route sending it lapses and another
    worker claims and sends."""
    request = notify(ann, "receipt", event_id="e1", variables=ORDER)

    def slow_provider(call) -> int:
        token = str(uuid.uuid4())
        [row] = rows("SELECT user_id, id FROM deliveries")
        key = (row["user_id"], row["id"])
        expire_lease(key)
        with engine().begin() as conn:
            assert claims.claim_deliveries(
                conn, [key], token=token, now=clock.now(), lease=60, max_attempts=8
            )
            assert claims.mark_sent(
                conn,
                key,
                token=token,
                platform="webhook",
                message_id="other-worker",
                now=clock.now(),
            )
        return 200

    with Endpoint(slow_provider) as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        assert route([ann], [request.request_id]) == 1  # the route's own send: its claim is lost
    assert endpoint.errors == []
    assert len(endpoint.calls) == 1
    row = _delivery()
    assert (row["state"], row["provider_message_id"], row["attempts"]) == (
        "sent",
        "other-worker",
        2,
    )
    assert [r["kind"] for r in rows("SELECT kind FROM incidents")] == ["possible_duplicate"]


def test_a_request_whose_publish_was_lost_is_routed_by_the_sweeper(ann, monkeypatch):
    configure(monkeypatch, faults="notify.before_publish=raise")
    with frozen_clock() as clk:
        with pytest.raises(FaultInjected, match=r"^notify\.before_publish$"):
            notify(ann, "receipt", event_id="e1", variables=ORDER)
        [request] = rows("SELECT id, state, due_at FROM requests")
        assert (request["state"], request["due_at"]) == ("pending", clk.now + timedelta(seconds=30))
        assert published(LANE)[ROUTE] == []
        assert _tick() == NOTHING
        clk.advance(30)
        assert _tick() == {"requests": 1, "deliveries": 0}
        assert published(LANE)[ROUTE] == [(ann, request["id"])]
        assert route([ann], [request["id"]]) == 1
    assert count("deliveries") == 1


def test_deliveries_a_route_died_before_sending_are_sent_after_the_sweeper(
    ann, receiver, monkeypatch
):
    """The route committed its deliveries claimed and died before its send: the claim's lease
    runs out (on PostgreSQL's clock), and the tick hands the row to a deliver task."""
    configure(monkeypatch, faults="route.after_commit=raise*1")
    with frozen_clock() as clk:
        request = notify(ann, "receipt", event_id="e1", variables=ORDER)
        with pytest.raises(FaultInjected, match=r"^route\.after_commit$"):
            route([ann], [request.request_id])
        [row] = rows("SELECT user_id, id, state, attempts, due_at, lease_until FROM deliveries")
        assert (row["state"], row["attempts"]) == ("claimed", 1)
        # due for the tick when its lease is out
        assert abs((row["due_at"] - row["lease_until"]).total_seconds()) < 1
        assert published(LANE)[DELIVER] == []
        assert route([ann], [request.request_id]) == 0  # the request was resolved: once
        clk.advance(30)
        assert _tick() == NOTHING  # the lease still stands
        key = (row["user_id"], row["id"])
        expire_lease(key)
        assert _tick() == {"requests": 0, "deliveries": 1}
        assert published(LANE)[DELIVER] == [key]
        assert _deliver(key) == 1
    row = _delivery()
    assert (row["state"], row["attempts"], row["taken_over"]) == ("sent", 2, True)
    assert receiver.arrivals.total == 1
    assert count("incidents") == 0  # the route never reached the send: nothing may repeat


def test_a_route_that_fails_before_commit_leaves_the_request_to_be_routed_again(ann, monkeypatch):
    configure(monkeypatch, faults="route.before_commit=raise*1")
    with frozen_clock() as clk:
        request = notify(ann, "two_channels", event_id="e1")
        with pytest.raises(FaultInjected, match=r"^route\.before_commit$"):
            route([ann], [request.request_id])
        assert rows("SELECT state FROM requests") == [{"state": "pending"}]
        assert (count("deliveries"), count("decisions")) == (0, 0)
        clk.advance(30)
        assert _tick() == {"requests": 1, "deliveries": 0}
        assert route([ann], [request.request_id]) == 1
    assert count("deliveries") == 2


# --- where tasks are published ----------------------------------------------------------------

# A process that touches a task proxy (as pytest's collection does with `from tasks.route import
# route`) before its CLARION_* settings are in place, and then publishes with those settings.
# --- the sweeper -------------------------------------------------------------------------------


def test_tick_leaves_alone_work_whose_time_has_not_come(ann, monkeypatch):
    with frozen_clock() as clk:
        _retrying(ann, ["e1"], monkeypatch)  # the delivery's retry is due in about 2 s
        [row] = rows("SELECT due_at FROM deliveries")
        due = row["due_at"]
        assert due > clk.now
        assert _tick() == NOTHING
        clk.now = due - timedelta(milliseconds=1)
        assert _tick() == NOTHING
        assert published(LANE)[DELIVER] == []
        clk.now = due
        assert _tick() == {"requests": 0, "deliveries": 1}
        assert _tick() == NOTHING  # pushed a stray interval ahead again
        [row] = rows("SELECT due_at FROM deliveries")
        assert row["due_at"] == clk.now + timedelta(seconds=30)


def test_two_ticks_at_the_same_instant_take_each_due_row_once(ann, monkeypatch):
    with frozen_clock() as clk:
        _retrying(ann, [f"r{n}" for n in range(20)], monkeypatch)
        clk.advance(31)  # the 20 deliveries' retries are now due
        with engine().begin() as conn:  # 30 outbox requests, due now
            notify_many(
                [
                    dict(user_id=ann, type_key="receipt", event_id=f"o{n}", variables=ORDER)
                    for n in range(30)
                ],
                connection=conn,
            )
        drain(LANE)
        results = race(2, tick)  # two beat processes
        assert results.most_at_once() == 2  # both ticks ran at once
        keys = published(LANE)
        assert _tick() == NOTHING
    assert sum(r["requests"] for r in results) == 30
    assert sum(r["deliveries"] for r in results) == 20
    route_keys, deliver_keys = keys[ROUTE], keys[DELIVER]
    assert len(route_keys) == len(set(route_keys)) == 30
    assert len(deliver_keys) == len(set(deliver_keys)) == 20


def test_a_webhook_send_inside_its_claims_lease_writes_nothing_before_the_send(ann, monkeypatch):
    """The webhook receiver dedups by key, so while the claim's lease covers the whole send no
    begin_send is written (one statement per row saved); a channel that cannot dedup always asks."""
    seen: list[object] = []

    def provider(call) -> int:
        seen.extend(r["send_started_at"] for r in rows("SELECT send_started_at FROM deliveries"))
        return 200

    with Endpoint(provider) as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        _routed(ann)  # the route's own send, inside the lease its insert claimed
    assert seen == [None]
    assert _delivery()["state"] == "sent"


def test_a_published_batch_is_described_in_a_few_words(ann):
    """Flower and the logs show a batch by its size and first key (Celery's own repr of every key
    cost as much as the rest of the publish)."""
    import kombu

    made = notify_many(
        [dict(user_id=ann, type_key="receipt", event_id=f"d{i}", variables=ORDER) for i in range(3)]
    )
    with kombu.Connection(settings.get().urls()[2]) as conn:
        waiting = conn.SimpleQueue(LANE)
        try:
            message = waiting.get(block=False)
            headers = message.headers
            message.ack()
        finally:
            waiting.close()
    assert headers["task"] == ROUTE
    assert headers["argsrepr"] == f"['ann' #{made[0].request_id} and 2 more]"


def test_a_pace_asks_for_as_many_senders_as_keep_one_busy() -> None:
    from clarion.tasks.send.pool import Pace

    pace = Pace()
    assert pace.senders(8) == 8  # nothing seen yet: all of them
    for _ in range(50):
        pace.note(0.0005, 0.0003)  # a provider answering in 0.3 ms of a 0.5 ms row
    assert pace.senders(8) == 3
    for _ in range(5):
        pace.note(0.1, 0.0998)  # it slows to 100 ms: the average follows within a few rows
    assert pace.senders(8) == 8


def test_a_batch_against_a_provider_that_slows_down_adds_senders_within_the_batch(ann, monkeypatch):
    """A batch started with the few senders a fast provider needs (tasks.send.pool.Pace) adds
    more, up to CLARION_SEND_CONCURRENCY (8), as soon as its rows come back slower."""
    import threading
    import time

    from clarion.tasks.send import pool

    fast = pool.Pace()
    for _ in range(50):
        fast.note(0.0005, 0.0003)
    monkeypatch.setitem(pool.paces, "webhook", fast)  # what a fast provider taught it
    assert fast.senders(8) == 3

    lock, in_flight, most = threading.Lock(), [0], [0]

    def slow(call) -> int:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.05)  # the provider's own latency, not a wait for something to happen
        with lock:
            in_flight[0] -= 1
        return 200

    with Endpoint(slow) as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        made = notify_many(
            [
                dict(user_id=ann, type_key="receipt", event_id=f"s{i}", variables=ORDER)
                for i in range(48)
            ]
        )
        assert route([ann] * 48, [m.request_id for m in made]) == 48  # and the route sends them
    assert count("deliveries", "state = 'sent'") == 48
    # the provider saw more sends in flight at once than the 3 the batch started with: senders
    # were added within the batch (counted at the provider, not read off a wall clock)
    assert most[0] >= 6, most[0]  # (timing decides 6, 7 or 8)
