"""Slack end to end: the real slack_sdk and slack_bolt against a local server speaking the Slack Web
API (tests/support/fake_slack.py), real PostgreSQL and Redis, the pipeline run in-process.

Sends (Block Kit, metadata), 429 pausing the workspace, deactivated users, crash reconciliation,
clicks through clarion's real HTTP endpoint (signed as Slack signs), the App Home, a host's own
Bolt App with clarion's handlers registered, and a hypothesis fuzz over forged button values.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from slack_bolt import App
from slack_bolt.adapter.starlette import SlackRequestHandler
from slack_sdk import WebClient
from starlette.applications import Starlette
from starlette.routing import Route

from clarion import clock
from clarion import settings as clarion_settings
from clarion.adapters.slack import answered_blocks, error_for, find_posted, metadata, to_blocks
from clarion.catalog import Button
from clarion.db import claims
from clarion.db.engine import engine
from clarion.db.interactions import interaction_target
from clarion.errors import (
    FaultInjected,
    PermanentSendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, decode_value
from clarion.standins.fake_slack import (
    FakeSlack,
    block_actions,
    event_callback,
    serving,
    signed,
)
from clarion.tasks import notify, register_recipient, runtime
from clarion.tasks.interactions import handle_click
from clarion.tasks.preferences import get_preferences
from clarion.tasks.route import route
from clarion.tasks.tick import tick
from clarion.web import slack as web_slack
from clarion.web.app import create_app
from tests.support.pipeline import (
    configure,
    count,
    drain,
    expire_lease,
    frozen_clock,
    rows,
)
from tests.support.slack import (
    FORM,
    SECRET,
    Key,
    ana,
    click_value,
    deliver_keys,
    fake,
    slack_delivery,
    slack_env,
    slack_nudge,
)

pytestmark = pytest.mark.integration
__all__ = ["ana", "fake", "slack_env"]  # fixtures, from tests/support/slack.py

GOAL_LABELS = ["Grow my team", "Ship faster", "Raise quality"]


@pytest.fixture
def web(slack_env) -> Iterator[str]:
    with serving(create_app()) as url:
        yield url


def _sent_by_route(key: Key) -> None:
    """The route sent what it routed, itself: the row is recorded sent, with Slack's message."""
    row = slack_delivery(key)
    assert (row["state"], row["attempts"]) == ("sent", 1) and row["provider_message_id"]


def _post(
    url: str,
    body: bytes,
    content_type: str = FORM,
    *,
    secret: str = SECRET,
    at: float | None = None,
) -> httpx.Response:
    return httpx.post(
        url, content=body, headers=signed(secret, body, content_type=content_type, at=at)
    )


def _click(url: str, key: Key, answer: str, *, user: str = "U1", **kw) -> httpx.Response:
    channel, ts = slack_delivery(key)["provider_message_id"].split(":")
    body = block_actions(
        user, click_value(key, answer), action_id=f"clarion:{answer}", channel=channel, ts=ts
    )
    return _post(f"{url}/slack/events", body, **kw)


def _context_text(blocks: list[dict]) -> list[str]:
    return [e["text"] for b in blocks if b["type"] == "context" for e in b["elements"]]


# --- pure parts: tables -------------------------------------------------------------------------------

MESSAGE = Message(
    delivery_id=7,
    user_id="ana",
    type_key="goal_prompt",
    occurrence_key="event:e1",
    channel="slack",
    content={"title": "Pick <one>", "body": "a & b <!channel>"},
    address="U1",
    buttons=(
        Button("go", "Go", style="primary"),
        Button("no", "No"),
        Button("x", "Stop", style="danger"),
    ),
)


def test_blocks_carry_escaped_content_and_the_catalogs_buttons():
    header, section, actions = to_blocks(MESSAGE)
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "Pick <one>", "emoji": True},
    }
    assert section["text"] == {"type": "mrkdwn", "text": "a &amp; b &lt;!channel&gt;"}
    assert [
        (e["text"]["text"], e["value"], e["action_id"], e.get("style")) for e in actions["elements"]
    ] == [
        ("Go", '{"u":"ana","d":7,"a":"go"}', "clarion:go", "primary"),
        ("No", '{"u":"ana","d":7,"a":"no"}', "clarion:no", None),
        ("Stop", '{"u":"ana","d":7,"a":"x"}', "clarion:x", "danger"),
    ]
    answered = answered_blocks(MESSAGE, "Go")
    assert answered[:2] == [header, section] and _context_text(answered) == ["Answered: Go"]
    assert [b["type"] for b in to_blocks(Message(**{**MESSAGE.__dict__, "buttons": ()}))] == [
        "header",
        "section",
    ]
    long = to_blocks(
        Message(**{**MESSAGE.__dict__, "content": {"title": "t" * 400, "body": "b" * 5000}})
    )
    assert (len(long[0]["text"]["text"]), len(long[1]["text"]["text"])) == (150, 3000)


@pytest.mark.parametrize(
    ("status", "error", "headers", "kind", "reason", "retry_after"),
    [
        (429, "ratelimited", {"Retry-After": "30"}, ThrottledError, "ratelimited", 30.0),
        (429, "ratelimited", {}, ThrottledError, "ratelimited", 30.0),
        (200, "ratelimited", {"retry-after": "5"}, ThrottledError, "ratelimited", 5.0),
        (200, "internal_error", {}, TransientSendError, "internal_error", None),
        (200, "fatal_error", {}, TransientSendError, "fatal_error", None),
        (200, "service_unavailable", {}, TransientSendError, "service_unavailable", None),
        (200, "request_timeout", {}, TransientSendError, "request_timeout", None),
        (
            503,
            "Received a response in a non-JSON format: <html>",
            {},
            TransientSendError,
            "http_503",
            None,
        ),
        (200, "user_not_found", {}, PermanentSendError, "user_not_found", None),
        (200, "user_disabled", {}, PermanentSendError, "user_disabled", None),
        (200, "cannot_dm_bot", {}, PermanentSendError, "cannot_dm_bot", None),
        (200, "account_inactive", {}, PermanentSendError, "account_inactive", None),
        (200, "invalid_auth", {}, PermanentSendError, "invalid_auth", None),
        (200, "channel_not_found", {}, PermanentSendError, "channel_not_found", None),
        (200, "invalid_blocks", {}, PermanentSendError, "invalid_blocks", None),
        (404, None, {}, PermanentSendError, "http_404", None),
    ],
)
def test_slack_errors_map_to_transient_or_permanent(
    status, error, headers, kind, reason, retry_after
):
    mapped = error_for(status, error, headers)
    assert type(mapped) is kind and mapped.reason == reason
    assert getattr(mapped, "retry_after", None) == retry_after


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (500, UnknownSendError),
        (503, UnknownSendError),
        (429, ThrottledError),
        (200, TransientSendError),
    ],
)
def test_a_5xx_from_a_post_leaves_its_outcome_unknown(status, kind):
    """Slack may have posted before failing: unknown (reconciled next), never a plain retry."""
    error = "internal_error" if status == 200 else ("ratelimited" if status == 429 else None)
    assert type(error_for(status, error, {}, posting=True)) is kind


@pytest.mark.parametrize(
    ("history", "found"),
    [
        ([], None),
        ([{"ts": "1.1", "metadata": metadata(MESSAGE)}], "1.1"),
        ([{"ts": "1.2", "text": "hi"}, {"ts": "1.1", "metadata": metadata(MESSAGE)}], "1.1"),
        ([{"ts": "1.1", "metadata": {**metadata(MESSAGE), "event_type": "other"}}], None),
        (
            [
                {
                    "ts": "1.1",
                    "metadata": {
                        "event_type": "clarion_delivery",
                        "event_payload": {"delivery_id": 8, "user_id": "ana"},
                    },
                }
            ],
            None,
        ),
        (
            [
                {
                    "ts": "1.1",
                    "metadata": {
                        "event_type": "clarion_delivery",
                        "event_payload": {"delivery_id": "7", "user_id": "bob"},
                    },
                }
            ],
            None,
        ),
        (
            [
                {
                    "ts": "1.1",
                    "metadata": {
                        "event_type": "clarion_delivery",
                        "event_payload": {"delivery_id": "7", "user_id": "ana"},
                    },
                }
            ],
            "1.1",
        ),
        (["junk", {"metadata": "junk"}], None),
    ],
)
def test_reconciliation_recognises_only_this_deliverys_metadata(history, found):
    assert find_posted(history, MESSAGE) == found


# --- sending ---------------------------------------------------------------------------------------------


def test_a_manager_with_a_slack_address_gets_the_nudge_with_catalog_buttons(ana, fake):
    key = slack_nudge(ana)
    _sent_by_route(key)
    [posted] = fake.posts()
    row = slack_delivery(key)
    assert (row["state"], row["platform"]) == ("sent", "slack")
    assert row["provider_message_id"] == f"DU1:{posted.ts}" and posted.channel == "DU1"
    header, section, actions = posted.blocks
    assert header["text"]["text"] == "What should this quarter be about?"
    assert section["text"]["text"] == "Ana, pick the goal your plan should focus on."
    assert [e["text"]["text"] for e in actions["elements"]] == GOAL_LABELS
    assert [e["value"] for e in actions["elements"]] == [
        click_value(key, a) for a in ("grow_team", "ship_faster", "quality")
    ]
    assert [decode_value(e["value"]).delivery_id for e in actions["elements"]] == [key[1]] * 3
    assert posted.metadata["event_type"] == "clarion_delivery"
    assert posted.metadata["event_payload"]["delivery_id"] == key[1]
    assert posted.metadata["event_payload"]["user_id"] == ana
    # one platform: Teams has no adapter here, and the request is not sent twice
    assert rows("SELECT channel, gate, reason FROM decisions") == [
        {"channel": "teams", "gate": "channel", "reason": "no_adapter"}
    ]
    assert deliver_keys(key) == 0 and len(fake.called("chat.postMessage")) == 1


def test_a_429_pauses_the_workspace_and_the_nudges_go_out_once_when_it_lifts(ana, fake):
    register_recipient("bob", timezone="UTC", addresses={"slack": "U2"})
    fake.fail("chat.postMessage", "ratelimited", status=429, retry_after=30)
    with frozen_clock() as clk:
        start = clk.now
        first = slack_nudge(ana)  # the route's own send gets the 429
        assert slack_delivery(first)["state"] == "pending"
        assert _waited(first, start) == pytest.approx(30, abs=6.01)
        assert slack_delivery(first)["last_error"].startswith("ratelimited")
        assert slack_delivery(first)["attempts"] == 0  # a rate limit is not an attempt
        [pause] = redis.Redis.from_url(clarion_settings.get().urls()[1]).keys(
            "clarion:rl:{slack:*:pause"
        )

        second = slack_nudge("bob")  # the route's own send: paused, not even tried
        assert slack_delivery(second)["state"] == "pending"
        assert len(fake.called("chat.postMessage")) == 1
        assert slack_delivery(second)["last_error"].startswith("paused")
        assert 29 <= _waited(second, start) <= 36

        clk.advance(29)
        assert tick()["deliveries"] == 0
        clk.advance(8)
        assert tick()["deliveries"] == 2
        assert deliver_keys(first, second) == 2
    assert pause
    assert sorted(p.channel for p in fake.posts()) == ["DU1", "DU2"]
    assert len(fake.called("chat.postMessage", ok=True)) == 2
    assert [slack_delivery(k)["state"] for k in (first, second)] == ["sent", "sent"]


def _waited(key: Key, since) -> float:
    return (slack_delivery(key)["not_before"] - since).total_seconds()


def test_twenty_bounces_off_a_workspace_pause_do_not_fail_the_nudge(ana, fake, monkeypatch):
    """Each round another manager's nudge meets a 429, which pauses the workspace for every
    worker; Ana's retry, due by then, is claimed and bounces off that pause without calling Slack.
    Twenty bounces with max_attempts 3: still pending, no attempt used, and sent once at the end."""
    configure(monkeypatch, max_attempts=3)
    fake.fail("chat.postMessage", "ratelimited", status=429, retry_after=30)
    with frozen_clock() as clk:
        key = slack_nudge(ana)  # the route's own send meets the first 429
        others = []
        for n in range(20):
            clk.advance(37)  # the pause Ana met has lifted and her retry is due
            register_recipient(f"bob{n}", timezone="UTC", addresses={"slack": f"U{100 + n}"})
            fake.fail("chat.postMessage", "ratelimited", status=429, retry_after=30)
            others.append(slack_nudge(f"bob{n}"))  # a 429 again: the workspace is paused anew
            calls = len(fake.called("chat.postMessage"))
            assert deliver_keys(key) == 0  # claimed, and released at the pause: Slack not called
            assert len(fake.called("chat.postMessage")) == calls == n + 2
            row = slack_delivery(key)
            assert (row["state"], row["attempts"]) == ("pending", 0)
            assert row["last_error"].startswith("paused")
        clk.advance(37)
        assert deliver_keys(key, *others) == 21
    assert slack_delivery(key)["state"] == "sent" and slack_delivery(key)["attempts"] == 1
    assert sorted(p.channel for p in fake.posts()) == sorted(
        ["DU1", *(f"DU{100 + n}" for n in range(20))]
    )


def test_a_transient_slack_error_is_retried_and_a_permanent_one_fails_with_its_reason(ana, fake):
    fake.fail("chat.postMessage", "internal_error")
    fake.fail("chat.postMessage", "invalid_blocks")
    with frozen_clock() as clk:
        key = slack_nudge(ana)  # the route's own send: internal_error
        assert (slack_delivery(key)["state"], slack_delivery(key)["last_error"][:14]) == (
            "pending",
            "internal_error",
        )
        clk.advance(3)
        assert deliver_keys(key) == 0
    assert slack_delivery(key)["state"] == "failed"
    assert rows("SELECT reason FROM decisions WHERE gate = 'deliver'") == [
        {"reason": "invalid_blocks"}
    ]
    assert count("suppressions") == 0
    assert fake.posts() == []


def test_a_deactivated_user_fails_and_is_suppressed_for_the_next_nudge(ana, fake):
    fake.deactivate("U1")
    key = slack_nudge(ana)  # the route's own send: user_disabled
    assert slack_delivery(key)["state"] == "failed"
    assert rows("SELECT gate, outcome, reason FROM decisions WHERE delivery_id = :d", d=key[1]) == [
        {"gate": "deliver", "outcome": "failed", "reason": "user_disabled"}
    ]
    assert rows("SELECT user_id, channel, address, reason FROM suppressions") == [
        {"user_id": "ana", "channel": "slack", "address": "U1", "reason": "deactivated"}
    ]

    assert slack_nudge(ana, "stalled_plan", event="e2") is None
    [request] = rows("SELECT id FROM requests WHERE type_key = 'stalled_plan'")
    assert rows(
        "SELECT channel, gate, reason FROM decisions WHERE request_id = :r AND channel = 'slack'",
        r=request["id"],
    ) == [{"channel": "slack", "gate": "suppression", "reason": "suppressed_address"}]
    assert fake.posts() == [] and len(fake.called("conversations.open")) == 1


def test_the_adapter_updates_a_sent_message_in_place_and_a_failed_update_raises(ana, fake):
    key = slack_nudge(ana)
    _sent_by_route(key)
    ref = slack_delivery(key)["provider_message_id"]
    with engine().begin() as conn:
        message = web_slack.message_for(interaction_target(conn, *key))
    adapter = runtime.adapters()["slack"]
    adapter.update(message, ref, "Raise quality")
    assert [_context_text(u) for u in fake.posts()[0].updates] == [["Answered: Raise quality"]]
    adapter.update(message, ref)  # no answer: as first sent, buttons and all (collapse in place)
    assert fake.posts()[0].updates[-1] == to_blocks(message)
    fake.fail("chat.update", "message_not_found")
    with pytest.raises(PermanentSendError, match="message_not_found"):
        adapter.update(message, ref, "Grow my team")
    with pytest.raises(PermanentSendError, match="bad_message_id"):
        adapter.update(message, "not-a-ref", "Grow my team")
    fake.fail("chat.update", "ratelimited", status=429, retry_after=30)
    with pytest.raises(ThrottledError, match=r"^ratelimited: slack answered 429"):
        adapter.update(message, ref, "Grow my team")
    with pytest.raises(ThrottledError, match="paused"):  # every worker waits the 429 out
        adapter.update(message, ref, "Grow my team")
    assert len(fake.posts()[0].updates) == 2


# --- reconciliation after a takeover -----------------------------------------------------------------------


def _attempt(key: Key) -> tuple[str, int, bool]:
    """(state, attempts, whether the last attempt reached the send: begin_send recorded it)."""
    [row] = rows(
        "SELECT state, attempts, send_started_at IS NOT NULL AS reached FROM deliveries"
        " WHERE user_id = :u AND id = :i",
        u=key[0],
        i=key[1],
    )
    return row["state"], row["attempts"], row["reached"]


def _posted_then_lost(user: str, monkeypatch) -> Key:
    """The route's own send posts, then its "sent" record is lost (the flush fails, as when the
    process dies between the two): the row stays claimed, its attempt marked as having reached
    Slack, until its lease runs out (on PostgreSQL's clock)."""
    configure(monkeypatch, faults="deliver.before_flush=raise*1")
    key = slack_nudge(user)
    assert key is not None
    assert _attempt(key) == ("claimed", 1, True)
    expire_lease(key)
    return key


def _died_before_the_send(user: str, monkeypatch) -> Key:
    """The route claims its delivery, then dies before the send reaches Slack; the claim's lease
    runs out."""
    configure(monkeypatch, faults="deliver.after_claim=raise*1")
    request = notify(user, "goal_prompt", event_id="e1", variables={"first_name": "Ana"})
    with pytest.raises(FaultInjected, match=r"^deliver\.after_claim$"):
        route([user], [request.request_id])
    drain("activation")
    [found] = rows(
        "SELECT user_id, id FROM deliveries WHERE request_id = :r AND channel = 'slack'",
        r=request.request_id,
    )
    key = (found["user_id"], found["id"])
    assert _attempt(key) == ("claimed", 1, False)
    expire_lease(key)
    return key


def _take_over_and_die_sending(key: Key) -> None:
    """A later worker takes the lapsed claim over and reaches the send (begin_send records that
    the attempt may reach Slack), then dies before posting; its lease runs out too."""
    token = str(uuid.uuid4())
    with engine().begin() as conn:
        [row] = claims.claim_deliveries(
            conn, [key], token=token, now=clock.now(), lease=60, max_attempts=8
        )
        assert row.taken_over
        assert claims.begin_send(conn, key, token=token, need=30) is not None
    expire_lease(key)


def test_a_takeover_finds_the_earlier_message_by_metadata_and_does_not_post_again(
    ana, fake, monkeypatch
):
    key = _posted_then_lost(ana, monkeypatch)
    assert deliver_keys(key) == 1
    [posted] = fake.posts()
    row = slack_delivery(key)
    assert (row["state"], row["provider_message_id"], row["attempts"]) == (
        "sent",
        f"DU1:{posted.ts}",
        2,
    )
    assert len(fake.called("chat.postMessage")) == 1
    assert len(fake.called("conversations.history")) == 1
    [history] = fake.called("conversations.history")
    assert (
        int(history.params["limit"]) <= 15 and float(history.params["oldest"]) > time.time() - 3600
    )
    assert count("incidents") == 0  # reconciled: nothing was repeated


def test_an_error_after_posting_is_reconciled_not_reposted(ana, fake, monkeypatch):
    configure(monkeypatch, faults="deliver.after_send=raise*1")
    with frozen_clock() as clk:
        key = slack_nudge(ana)  # the route's own send posted, then an error: the outcome is unknown
        assert slack_delivery(key)["state"] == "pending"
        assert slack_delivery(key)["maybe_sent_at"] is not None
        clk.advance(3)
        assert tick()["deliveries"] == 1
        assert deliver_keys(key) == 1
    assert len(fake.posts()) == 1 and slack_delivery(key)["state"] == "sent"
    assert len(fake.called("conversations.history")) == 1 and count("incidents") == 0


def test_a_takeover_that_finds_nothing_posts_once(ana, fake, monkeypatch):
    key = _died_before_the_send(ana, monkeypatch)
    _take_over_and_die_sending(key)  # reached the send, died before posting
    assert deliver_keys(key) == 1
    assert len(fake.posts()) == 1
    assert len(fake.called("conversations.history")) == 1
    assert count("incidents") == 0


def test_a_takeover_without_a_send_does_not_look(ana, fake, monkeypatch):
    """An attempt that died before reaching the provider cannot have posted: no history call."""
    key = _died_before_the_send(ana, monkeypatch)
    assert deliver_keys(key) == 1
    assert len(fake.posts()) == 1 and fake.called("conversations.history") == []


def test_a_rate_limited_reconciliation_asks_again_later_and_never_posts_twice(
    ana, fake, monkeypatch
):
    key = _posted_then_lost(ana, monkeypatch)
    with frozen_clock() as clk:
        fake.fail("conversations.history", "ratelimited", status=429, retry_after=60)
        assert deliver_keys(key) == 0
        row = slack_delivery(key)
        assert row["state"] == "pending" and row["last_error"].startswith(
            "reconcile_pending: ratelimited"
        )
        assert row["maybe_sent_at"] is not None and row["attempts"] == 1  # asking is not an attempt
        assert 60 <= _waited(key, clk.now) <= 72
        # a history limit is not a posting limit: the workspace is not paused
        assert (
            redis.Redis.from_url(clarion_settings.get().urls()[1]).keys("clarion:rl:{slack:*:pause")
            == []
        )
        clk.advance(73)
        assert deliver_keys(key) == 1  # a plain retry, no longer "taken over", still looks first
    assert len(fake.called("chat.postMessage")) == 1
    assert len(fake.called("conversations.history")) == 2
    assert slack_delivery(key)["state"] == "sent"


# --- clicks through clarion's HTTP endpoint ----------------------------------------------------------------


def _answered(key: Key) -> tuple[str | None, str]:
    row = slack_delivery(key)
    return row["answer"], row["state"]


def _outcomes() -> list[tuple[str, str]]:
    return [
        (r["outcome"], r["reason"])
        for r in rows("SELECT outcome, reason FROM interactions ORDER BY id")
    ]


def test_a_click_answers_the_delivery_and_updates_the_message_in_place(ana, fake, web):
    key = slack_nudge(ana)
    _sent_by_route(key)
    response = _click(web, key, "ship_faster")
    assert response.status_code == 200
    assert _answered(key) == ("ship_faster", "answered")
    assert slack_delivery(key)["answered_by"] == "slack:U1"
    [posted] = fake.posts()
    [update] = posted.updates
    assert _context_text(update) == ["Answered: Ship faster"]
    assert "actions" not in [b["type"] for b in update]
    assert [b["text"]["text"] for b in update[:2]] == [
        "What should this quarter be about?",
        "Ana, pick the goal your plan should focus on.",
    ]

    assert _click(web, key, "quality").status_code == 200  # a second click: the first answer stands
    assert _answered(key) == ("ship_faster", "answered")
    assert [_context_text(u) for u in posted.updates] == [["Answered: Ship faster"]] * 2
    assert _outcomes() == [("accepted", "answer"), ("repeated", "already_answered")]
    assert len(fake.called("auth.test")) == 1  # Bolt's first-request check, answered locally


def test_someone_elses_click_changes_nothing_and_gets_an_ephemeral_reply(ana, fake, web):
    key = slack_nudge(ana)
    _sent_by_route(key)
    assert _click(web, key, "quality", user="U2").status_code == 200
    assert _answered(key) == (None, "sent")
    assert fake.posts()[0].updates == []
    assert _outcomes() == [("rejected", "foreign_user")]
    [ephemeral] = fake.called("chat.postEphemeral")
    assert ephemeral.params["user"] == "U2" and "isn't for you" in ephemeral.params["text"]


@pytest.mark.parametrize("forgery", ["bad_signature", "other_secret", "stale", "unsigned"])
def test_a_request_not_signed_by_slack_now_gets_401_and_changes_nothing(ana, fake, web, forgery):
    key = slack_nudge(ana)
    _sent_by_route(key)
    channel, ts = slack_delivery(key)["provider_message_id"].split(":")
    body = block_actions(
        "U1", click_value(key, "grow_team"), action_id="clarion:grow_team", channel=channel, ts=ts
    )
    headers = signed(SECRET, body, content_type=FORM)
    if forgery == "bad_signature":
        headers["X-Slack-Signature"] = "v0=" + "0" * 64
    elif forgery == "other_secret":
        headers = signed("not-the-secret", body, content_type=FORM)
    elif forgery == "stale":
        headers = signed(SECRET, body, content_type=FORM, at=time.time() - 301)
    else:
        headers = {"Content-Type": FORM}
    response = httpx.post(f"{web}/slack/events", content=body, headers=headers)
    assert response.status_code == 401
    assert _answered(key) == (None, "sent")
    assert count("interactions") == 0
    assert fake.posts()[0].updates == [] and fake.called("chat.postEphemeral") == []


def test_the_endpoint_answers_slacks_url_verification(web):
    body = json.dumps(
        {"type": "url_verification", "challenge": "c-123", "token": "legacy"}
    ).encode()
    response = _post(f"{web}/slack/events", body, "application/json")
    assert response.status_code == 200 and "c-123" in response.text


def test_the_endpoint_is_absent_without_slack_settings(slack_env, monkeypatch):
    configure(monkeypatch, slack_signing_secret=None)
    with serving(create_app()) as url:
        assert httpx.post(f"{url}/slack/events", content=b"{}").status_code == 404


# --- App Home preferences -----------------------------------------------------------------------------------


def _home(fake: FakeSlack, user: str) -> dict[str, str]:
    """The published Home tab as {type key: button value} (locked rows: 'locked')."""
    view = fake.views[user]
    return {
        b["block_id"].removeprefix("pref_"): b.get("accessory", {}).get("value", "locked")
        for b in view["blocks"]
        if b.get("block_id", "").startswith("pref_")
    }


def test_the_app_home_lists_the_managers_nudges_and_toggles_them(ana, fake, web):
    opened = event_callback(
        {"type": "app_home_opened", "user": "U1", "channel": "DU1", "tab": "home"}
    )
    assert _post(f"{web}/slack/events", opened, "application/json").status_code == 200
    catalog = runtime.catalog()
    assert _home(fake, "U1") == {
        k: "off" for k in sorted(catalog.types)
    }  # every one on: "turn off"

    toggle = block_actions("U1", "off", action_id="clarion_pref:stalled_plan", channel="DU1")
    assert _post(f"{web}/slack/events", toggle).status_code == 200
    assert _home(fake, "U1")["stalled_plan"] == "on"
    prefs = get_preferences(ana)
    assert prefs["settings"] == {"type:stalled_plan": False}
    assert not prefs["types"]["stalled_plan"]["slack"]["enabled"]
    assert not prefs["types"]["stalled_plan"]["teams"]["enabled"]
    assert slack_nudge(ana, "stalled_plan") is None
    assert rows("SELECT reason FROM decisions WHERE channel = 'slack'") == [{"reason": "opted_out"}]

    back_on = block_actions("U1", "on", action_id="clarion_pref:stalled_plan", channel="DU1")
    assert _post(f"{web}/slack/events", back_on).status_code == 200
    assert get_preferences(ana)["settings"] == {"type:stalled_plan": True}


def test_home_toggles_from_strangers_or_for_unknown_types_change_nothing(ana, fake, web):
    for user, action_id, value in [
        ("U9", "clarion_pref:stalled_plan", "off"),  # not a recipient
        ("U1", "clarion_pref:no_such_type", "off"),
        ("U1", "clarion_pref:stalled_plan", "maybe"),
        ("U1", "clarion_pref:stalled_plan/slack", "off"),
    ]:
        body = block_actions(user, value, action_id=action_id, channel="DU1")
        assert _post(f"{web}/slack/events", body).status_code == 200
    assert get_preferences(ana)["settings"] == {}
    opened = event_callback(
        {"type": "app_home_opened", "user": "U9", "channel": "DU9", "tab": "home"}
    )
    assert _post(f"{web}/slack/events", opened, "application/json").status_code == 200
    assert "no nudges" in json.dumps(fake.views["U9"])


# --- a host's own Bolt App -------------------------------------------------------------------------------------


def _wait_for(condition, seconds: float = 10.0) -> None:
    """The host's Bolt App runs listeners after ack, in its own threads: wait for their effect."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_register_puts_clarions_handlers_on_a_hosts_own_bolt_app(ana, fake):
    host_secret = "host-signing-secret"
    host = App(
        client=WebClient(token=FakeSlack.TOKEN, base_url=fake.api_url),
        signing_secret=host_secret,
        token_verification_enabled=False,
    )
    seen = []

    @host.action("host_button")
    def host_button(ack, action):  # the host's own handler keeps working
        ack()
        seen.append(action["value"])

    web_slack.register(host)
    handler = SlackRequestHandler(host)
    starlette = Starlette(routes=[Route("/host/slack", handler.handle, methods=["POST"])])
    key = slack_nudge(ana)
    _sent_by_route(key)
    channel, ts = slack_delivery(key)["provider_message_id"].split(":")
    with serving(starlette) as url:
        click = block_actions(
            "U1",
            click_value(key, "grow_team"),
            action_id="clarion:grow_team",
            channel=channel,
            ts=ts,
        )
        assert _post(f"{url}/host/slack", click, secret=host_secret).status_code == 200
        _wait_for(lambda: fake.posts()[0].updates)
        assert (
            _post(f"{url}/host/slack", click, secret=SECRET).status_code == 401
        )  # the host's secret
        own = block_actions("U1", "x", action_id="host_button", channel=channel, ts=ts)
        assert _post(f"{url}/host/slack", own, secret=host_secret).status_code == 200
        _wait_for(lambda: seen)
        opened = event_callback(
            {"type": "app_home_opened", "user": "U1", "channel": channel, "tab": "home"}
        )
        assert (
            _post(f"{url}/host/slack", opened, "application/json", secret=host_secret).status_code
            == 200
        )
        _wait_for(lambda: "U1" in fake.views)
    assert _answered(key) == ("grow_team", "answered")
    assert _context_text(fake.posts()[0].updates[-1]) == ["Answered: Grow my team"]
    assert seen == ["x"]


# --- fuzz: forged, truncated, oversized, wrong-type and foreign button values ------------------------------


def _deliveries_state() -> list[dict]:
    return rows(
        "SELECT user_id, id, state, answer, answered_at, answered_by, updated_at FROM deliveries"
        " ORDER BY id"
    )


@pytest.fixture
def three_deliveries(ana, fake) -> dict[str, Key]:
    """ana's and bob's nudges sent; cat's failed (her Slack account is gone)."""
    register_recipient("bob", timezone="UTC", addresses={"slack": "U2"})
    register_recipient("cat", timezone="UTC", addresses={"slack": "U3"})
    fake.deactivate("U3")
    nudged = {u: slack_nudge(u) for u in ("ana", "bob", "cat")}
    keys = {u: k for u, k in nudged.items() if k is not None}
    assert len(keys) == 3
    _sent_by_route(keys["ana"])
    _sent_by_route(keys["bob"])
    assert slack_delivery(keys["cat"])["state"] == "failed"
    assert len(fake.posts()) == 2
    return keys


def _values(keys: dict[str, Key]) -> st.SearchStrategy:
    real = [
        click_value(k, a) for k in keys.values() for a in ("grow_team", "ship_faster", "quality")
    ]
    ids = [k[1] for k in keys.values()]
    anything = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=40),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    )
    users = st.sampled_from(["ana", "bob", "cat", "dan", "", "ana\x00"]) | st.text(max_size=30)
    delivery_ids = (
        st.sampled_from(ids) | st.integers() | st.sampled_from([0, -1, 2**63, 10**30]) | anything
    )
    answers = st.sampled_from(["grow_team", "quality", "start", "x" * 33, ""]) | st.text(
        max_size=40
    )
    shaped = st.fixed_dictionaries(
        {"u": users | anything, "d": delivery_ids, "a": answers | anything}
    )
    return st.one_of(
        shaped.map(json.dumps),
        st.tuples(st.sampled_from(real), st.integers(0, 40)).map(
            lambda p: p[0][: len(p[0]) - 1 - p[1]]
        ),
        st.sampled_from(real).map(lambda v: v[:-1] + ',"x":1}'),  # an extra field
        st.sampled_from(real).map(lambda v: v + " " * 600),  # oversized
        st.sampled_from(real).map(lambda v: "[" + v + "]"),
        st.tuples(st.sampled_from(real), st.text(min_size=500, max_size=700)).map(
            lambda p: p[0].replace('"a":"', '"a":"' + p[1])
        ),
        st.sampled_from(real).map(lambda v: v.encode()),  # bytes
        st.sampled_from(real),  # genuine values, clicked by the wrong user or platform below
        st.text(max_size=600),
        st.binary(max_size=600),
        anything,
        st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=3), max_leaves=30).map(
            json.dumps
        ),
        st.just("[" * 5000 + "]" * 5000),
        st.just('{"u":"ana","d":1e400,"a":"x"}'),
        st.just('{"u":"\\ud800","d":1,"a":"quality"}'),
    )


ADDRESS = {"ana": "U1", "bob": "U2", "cat": "U3"}


@st.composite
def _near_miss(draw, keys: dict[str, Key]) -> tuple[str, str]:
    """(slack user, value): well formed, one step from a legitimate click (another answer, another
    delivery, another clicker, or cat's delivery, which is not open)."""
    owner = draw(st.sampled_from(sorted(ADDRESS)))
    ids = [keys[owner][1]] * 3 + [k[1] for k in keys.values()]
    delivery = draw(st.sampled_from(ids) | st.integers(1, 2**62))
    answer = draw(
        st.sampled_from(["grow_team", "ship_faster", "quality", "start", "stop", "Ship faster"])
    )
    clicker = draw(st.sampled_from([ADDRESS[owner]] * 3 + ["U1", "U2", "U9"]))
    return clicker, json.dumps({"u": owner, "d": delivery, "a": answer}, separators=(",", ":"))


@st.composite
def _forged_clicks(draw, keys: dict[str, Key]) -> tuple[str, str, object]:
    """(platform, slack user, raw value) for one forged click."""
    platform = draw(st.sampled_from(["slack", "slack", "slack", "teams"]))
    if draw(st.booleans()):
        return (platform, *draw(_near_miss(keys)))
    user = draw(st.sampled_from(["U1", "U2", "U3", "U9"]) | st.text(max_size=20))
    return platform, user, draw(_values(keys))


def _legitimate(keys: dict[str, Key], platform: str, slack_user: str, raw: object) -> bool:
    """A click that should be accepted: the owner's own open delivery, a catalog answer, on Slack."""
    value = decode_value(raw)
    owners = {"ana": "U1", "bob": "U2"}  # cat's delivery failed: not open
    return (
        value is not None
        and platform == "slack"
        and owners.get(value.user_id) == slack_user
        and (value.user_id, value.delivery_id) == keys[value.user_id]
        and value.answer in ("grow_team", "ship_faster", "quality")
    )


@pytest.mark.parametrize(
    "examples",
    [300, pytest.param(2200, marks=pytest.mark.soak)],  # thousands, once, in the soak tier
)
def test_thousands_of_forged_button_values_change_nothing_and_are_all_recorded(
    three_deliveries, examples
):
    before = _deliveries_state()
    clicks = []
    ana, cat = three_deliveries["ana"], three_deliveries["cat"]

    def shaped(user: str, delivery: int, answer: str) -> str:
        return json.dumps({"u": user, "d": delivery, "a": answer}, separators=(",", ":"))

    @settings(
        max_examples=examples + examples // 10,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(_forged_clicks(three_deliveries))
    # one of each reason always, whatever the draw: the set asserted below does not hang on luck
    @example(("slack", "U1", "{not json"))  # malformed
    @example(("slack", "U1", shaped("ana", 2**62, "grow_team")))  # unknown_delivery
    @example(("slack", "U9", click_value(ana, "grow_team")))  # foreign_user
    @example(("teams", "U1", click_value(ana, "grow_team")))  # wrong_platform
    @example(("slack", "U1", shaped("ana", ana[1], "start")))  # unknown_answer
    @example(("slack", "U3", click_value(cat, "grow_team")))  # not_sent: cat's failed delivery
    def forged_click(forged: tuple[str, str, object]) -> None:
        platform, slack_user, raw = forged
        assume(not _legitimate(three_deliveries, platform, slack_user, raw))
        click = handle_click(platform, slack_user, raw)
        clicks.append(click)
        assert click.outcome == "rejected", click
        assert click.reason != "internal_error"

    forged_click()
    assert len(clicks) >= examples
    assert _deliveries_state() == before
    assert count("interactions") == len(clicks)
    assert count("interactions", "outcome = 'rejected'") == len(clicks)
    reasons = {r["reason"] for r in rows("SELECT DISTINCT reason FROM interactions")}
    # (cat's failed delivery was never sent: clicking it is "not_sent"; a Teams click on a Slack
    # delivery is "wrong_platform")
    assert {
        "malformed",
        "unknown_delivery",
        "foreign_user",
        "wrong_platform",
        "unknown_answer",
        "not_sent",
    } <= reasons


def test_a_sample_of_forged_values_through_the_endpoint_changes_nothing(
    three_deliveries, fake, web
):
    before = _deliveries_state()
    ana, bob, cat = three_deliveries.values()
    rng = random.Random(5)
    samples: list[tuple[str, object]] = [
        ("U1", click_value(bob, "quality")),
        ("U2", click_value(ana, "quality")),
        ("U3", click_value(cat, "quality")),
        ("U1", click_value(ana, "start")),
        ("U1", click_value((ana[0], bob[1]), "quality")),
        ("U1", click_value(ana, "quality")[:-2]),
        ("U1", click_value(ana, "quality") + " " * 600),
        ("U1", None),
        ("U1", 12),
        ("U1", {"u": "ana", "d": ana[1], "a": "quality"}),
        ("U1", ["x"]),
        ("U1", "[" * 3000),
        ("U1", f'{{"u":"ana","d":"{ana[1]}","a":"quality"}}'),
        ("U1", f'{{"u":"ana","d":{ana[1]},"a":"quality","x":1}}'),
    ]
    samples += [
        ("U1", "".join(rng.choice('{}[]":,ud0123a\\ ') for _ in range(rng.randint(0, 80))))
        for _ in range(30)
    ]
    for user, value in samples:
        body = block_actions(user, value, action_id="clarion:quality", channel="DU1", ts="1.1")
        assert _post(f"{web}/slack/events", body).status_code == 200
    assert _deliveries_state() == before
    assert count("interactions") == count("interactions", "outcome = 'rejected'") == len(samples)
    assert all(p.updates == [] for p in fake.posts())
