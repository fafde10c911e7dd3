"""The third outcome of a send, produced on purpose: each provider's local server accepts the
request and then loses its answer (drops the connection, answers after the client's timeout, or
answers 500). Counted at the server, not in clarion's tables:

- webhook (receivers dedup on Idempotency-Key): sent again under the same key; one message per
  key at the receiver, which answers the repeat 409 — recorded as a `repeat` incident;
- Slack (message metadata): the next attempt finds the message and records it; one post, no incident;
- Teams (neither): an at-most-once type is held as `unknown` with an incident (one message at the
  connector); an at-least-once type is sent again with a `possible_duplicate` incident.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from clarion.adapters.teams import ConversationRef
from clarion.db import claims
from clarion.db.engine import engine
from clarion.errors import FaultInjected
from clarion.standins.fake_connector import FakeConnector
from clarion.standins.fake_slack import FakeSlack
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.pipeline import (
    configure,
    counted,
    drain,
    expire_lease,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

CATALOG = Path(__file__).parents[1] / "catalog_outcomes.yaml"
LOSSES = ("drop", "late", "5xx")
FAST = {"webhook_timeout": 1, "send_timeout": 3}  # a late answer (2 s) is past the client timeout


@pytest.fixture
def servers(clarion_env, monkeypatch) -> Iterator[tuple[Receiver, FakeSlack, FakeConnector]]:
    with (
        Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver,
        FakeSlack() as slack,
        FakeConnector() as connector,
    ):
        configure(
            monkeypatch,
            catalog=CATALOG,
            webhook_url=receiver.url,
            slack_token=FakeSlack.TOKEN,
            slack_api_url=slack.api_url,
            teams_app_id="none",
            **FAST,
        )
        ref = ConversationRef(connector.url, "a:1conversation", "tenant-1", "bot").to_json()
        register_recipient(
            "u1",
            timezone="UTC",
            addresses={"slack": "U1", "teams": "29:u1", "teams_conversation": ref},
        )
        with publishing_to_this_tests_broker():
            yield receiver, slack, connector


def _send_once(type_key: str) -> tuple[str, int]:
    request = notify("u1", type_key, event_id="e1")
    # Routed and sent in this process (the route sends what it routes): the answer was lost.
    assert route(["u1"], [request.request_id]) == 1
    drain("transactional"), drain("activation")
    [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request.request_id)
    key = (row["user_id"], row["id"])
    assert deliver([key[0]], [key[1]]) == 0  # nothing to claim: not due again yet, or held
    return key


def _retry(key: tuple[str, int]) -> int:
    """The next attempt, once it is due (the backoff is not what is tested here)."""
    with engine().begin() as conn:
        conn.execute(text("UPDATE deliveries SET not_before = now() WHERE state = 'pending'"))
    return deliver([key[0]], [key[1]])


def _row(key: tuple[str, int]) -> dict:
    [row] = rows(
        "SELECT state, attempts, maybe_sent_at, last_error FROM deliveries WHERE id = :d", d=key[1]
    )
    return row


def _incidents() -> list[str]:
    return [r["kind"] for r in rows("SELECT kind FROM incidents ORDER BY id")]


def _unknowns(channel: str) -> float:
    return counted("clarion_sends_total", channel=channel, outcome="unknown")


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("type_key", ["nudge_webhook", "receipt_webhook"])
def test_webhook_repeats_only_under_the_same_key(servers, loss, type_key):
    receiver, _, _ = servers
    receiver.arrivals.losses.next(loss)
    before = _unknowns("webhook")
    key = _send_once(type_key)
    row = _row(key)
    assert row["state"] == "pending" and row["maybe_sent_at"] is not None  # may have sent: owed
    assert _retry(key) == 1
    arrivals = receiver.arrivals
    assert arrivals.unique == 1 and arrivals.total == 2  # one message; the repeat under its key ...
    assert arrivals.repeats == 1 and len(arrivals.occurrences[f"u1/{type_key}/event:e1"]) == 1
    assert _row(key)["state"] == "sent"
    assert _incidents() == ["repeat"]  # ... answered 409, so clarion knows it happened
    assert _unknowns("webhook") - before == 1  # counted when the answer was lost, not again


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("type_key", ["nudge_slack", "receipt_slack"])
def test_slack_is_reconciled_and_posts_exactly_once(servers, loss, type_key):
    _, slack, _ = servers
    slack.losses.next(loss, match="chat.postMessage")
    key = _send_once(type_key)
    assert len(slack.posts()) == 1  # Slack has it; clarion does not know
    assert _row(key)["state"] == "pending"
    assert _retry(key) == 1
    assert len(slack.posts()) == 1 and len(slack.called("chat.postMessage")) == 1
    assert len(slack.called("conversations.history")) == 1
    assert _row(key)["state"] == "sent" and _incidents() == []


@pytest.mark.parametrize("loss", LOSSES)
def test_teams_holds_an_at_most_once_nudge_as_unknown(servers, loss):
    _, _, connector = servers
    connector.losses.next(loss)
    key = _send_once("nudge_teams")
    row = _row(key)
    assert row["state"] == "unknown" and row["maybe_sent_at"] is not None
    assert _retry(key) == 0  # held: nothing to claim
    assert len(connector.sent) == 1
    assert _incidents() == ["outcome_unknown"]
    assert rows("SELECT outcome, reason FROM decisions WHERE gate = 'deliver'") == [
        {
            "outcome": "unknown",
            "reason": {"drop": "no_answer", "late": "no_answer", "5xx": "http_500"}[loss],
        }
    ]


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("type_key", ["alert_teams", "nudge_teams_resent"])
def test_teams_resends_an_at_least_once_type_and_says_so(servers, loss, type_key):
    _, _, connector = servers
    connector.losses.next(loss)
    before = _unknowns("teams")
    key = _send_once(type_key)
    assert _row(key)["state"] == "pending"
    assert _retry(key) == 1
    assert len(connector.sent) == 2  # the provider cannot dedup: a possible duplicate ...
    assert _row(key)["state"] == "sent"
    assert _incidents() == ["possible_duplicate"]  # ... and the operator is told which
    assert _unknowns("teams") - before == 1  # counted when the answer was lost, not again


def test_a_send_whose_worker_died_mid_call_is_counted_unknown_by_the_taker(servers, monkeypatch):
    """Nobody settled the lapsed attempt, so the attempt that takes its claim over counts its
    unknown outcome (once), and resends the at-least-once type with a `possible_duplicate`."""
    _, _, connector = servers
    request = notify("u1", "alert_teams", event_id="e1")
    # The route inserts its row claimed under its own token and sends it itself; here it commits
    # and goes no further (a raise in place of its send) ...
    configure(monkeypatch, faults="route.after_commit=raise*1")
    with pytest.raises(FaultInjected, match=r"^route\.after_commit$"):
        route(["u1"], [request.request_id])
    configure(monkeypatch, faults=None)
    drain("transactional"), drain("activation")
    [row] = rows(
        "SELECT user_id, id, state, attempts, claim_token FROM deliveries WHERE request_id = :r",
        r=request.request_id,
    )
    assert (row["state"], row["attempts"]) == ("claimed", 1) and len(connector.sent) == 0
    key = (row["user_id"], row["id"])
    with engine().begin() as conn:  # ... as if its send had reached the provider call and died
        assert claims.begin_send(conn, key, token=str(row["claim_token"]), need=10) is not None
    expire_lease(key)
    before = _unknowns("teams")
    assert deliver([key[0]], [key[1]]) == 1
    assert _row(key)["state"] == "sent" and len(connector.sent) == 1
    assert _incidents() == ["possible_duplicate"]
    assert _unknowns("teams") - before == 1


def test_a_send_past_its_budget_is_unknown_even_if_the_client_would_wait(servers, monkeypatch):
    """The hard budget is the sum of a send's calls, not a per-read timeout."""
    receiver, _, _ = servers
    configure(monkeypatch, webhook_timeout=30, send_timeout=1)
    receiver.arrivals.losses.next("late", delay=3)
    key = _send_once("nudge_webhook")
    row = _row(key)
    assert row["state"] == "pending" and row["last_error"].startswith("deadline")
    assert receiver.arrivals.total == 1


def test_an_error_after_every_send_ends_failed_at_the_cap_with_one_message(servers, monkeypatch):
    """Not a SendError, and after the send: each attempt's outcome is unknown, each repeat goes
    under the same key, and the attempt cap still ends it (no claim is left behind)."""
    receiver, _, _ = servers
    configure(monkeypatch, max_attempts=3, faults="deliver.after_send=raise")
    key = _send_once("receipt_webhook")
    assert _retry(key) == 0 and _retry(key) == 0
    assert _retry(key) == 0  # the cap: nothing left to claim
    assert _row(key)["state"] == "failed" and _row(key)["attempts"] == 3
    assert receiver.arrivals.unique == 1 and receiver.arrivals.total == 3
    assert rows("SELECT reason FROM decisions WHERE gate = 'deliver'") == [
        {"reason": "retries_exhausted"}
    ]


def test_an_operator_redrives_a_held_unknown_send_under_the_same_row(servers):
    from clarion import clock
    from clarion.db import redrive

    _, _, connector = servers
    connector.losses.next("drop")
    key = _send_once("nudge_teams")
    assert _row(key)["state"] == "unknown"
    with engine().begin() as conn:
        assert redrive.requeue(conn, [key], states=("unknown",), now=clock.now()) == {key}
    assert deliver([key[0]], [key[1]]) == 1  # the operator's choice: sent again, not held again
    assert len(connector.sent) == 2 and _row(key)["state"] == "sent"


def test_a_stalled_send_holds_neither_its_row_nor_the_rest_of_its_batch(servers, monkeypatch):
    """One lane, three rows, the first answer 3 s late against a 1 s budget: that row is settled
    as unknown at its deadline, a new lane takes the other two, and the batch ends well before the
    late answer comes back (the stalled call is left behind, its answer unheeded)."""
    receiver, _, _ = servers
    configure(monkeypatch, webhook_timeout=30, send_timeout=1, send_concurrency=1)
    receiver.arrivals.losses.next("late", delay=3)
    requests = [notify("u1", "receipt_webhook", event_id=f"e{i}") for i in range(3)]
    drain("transactional")
    started = time.monotonic()  # the route sends what it routed, in this process
    assert route(["u1"] * 3, [r.request_id for r in requests]) == 3
    assert time.monotonic() - started < 2.5
    states = rows("SELECT state, last_error FROM deliveries ORDER BY id")
    assert states[0]["state"] == "pending" and states[0]["last_error"].startswith("deadline")
    assert [s["state"] for s in states[1:]] == ["sent", "sent"]  # the two sends recorded
    assert receiver.arrivals.unique == 3
    assert drain("transactional") == []  # sent in-process: nothing published for a deliver task
