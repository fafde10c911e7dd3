"""Microsoft Teams end to end: the real botbuilder / botframework-connector SDKs against a local
server speaking the Bot Framework connector protocol (clarion/standins/fake_connector.py), real
PostgreSQL and Redis, the pipeline run in-process, clicks through clarion's real /api/messages.

Also: the pure parts (cards, payload parsing, error mapping) as tables, the botbuilder 4.17.1 invoke
bug with the stock CloudAdapter and its fix, Bot Framework token checks, the per-conversation
limiter, a host's own ActivityHandler calling handle_teams_activity (botbuilder's TestAdapter), and
a hypothesis fuzz over Teams payloads.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import jwt
import pytest
import redis
from aiohttp import web as aiohttp_web
from aiohttp.test_utils import TestClient as AiohttpClient
from aiohttp.test_utils import TestServer as AiohttpServer
from botbuilder.core import ActivityHandler, TurnContext
from botbuilder.core.adapters import TestAdapter
from botbuilder.integration.aiohttp import CloudAdapter, ConfigurationBotFrameworkAuthentication
from botbuilder.schema import (
    Activity,
    AdaptiveCardInvokeResponse,
    ChannelAccount,
    ConversationAccount,
)
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.applications import Starlette
from starlette.testclient import TestClient

from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.adapters.teams import (
    ConversationRef,
    TeamsAction,
    TeamsAdapter,
    answered_card,
    credentials_for,
    from_activity,
    message_id,
    preferences_changes,
    send_error,
    split_message_id,
    to_card,
)
from clarion.catalog import Button
from clarion.errors import PermanentSendError, ThrottledError, TransientSendError, UnknownSendError
from clarion.records import ButtonValue, Message, decode_value
from clarion.standins.fake_connector import FakeConnector
from clarion.tasks import notify, register_recipient, runtime
from clarion.tasks.deliver import deliver
from clarion.tasks.preferences import get_preferences
from clarion.tasks.route import route
from clarion.tasks.tick import tick
from clarion.web import teams as web_teams
from clarion.web.app import create_app
from tests.support.pipeline import (
    configure,
    count,
    drain,
    frozen_clock,
    rows,
)
from tests.support.teams import (
    BOT,
    CONVERSATION,
    EVE_TEAMS,
    MIA,
    MIA_TEAMS,
    client,
    connector,
    delivered,
    delivery,
    execute,
    invoke,
    mia,
    nudge,
    post,
    signing_keys,
    teams,
    teams_activity,
    value,
)

pytestmark = pytest.mark.integration
__all__ = ["client", "connector", "mia", "teams"]  # fixtures, from tests/support/teams.py

KICKOFF_LABELS = ["Let's go", "Not this week"]


# --- the pure parts, as tables ---------------------------------------------------------------------

MESSAGE = Message(
    delivery_id=41,
    user_id="u1",
    type_key="goal_prompt",
    occurrence_key="event:g",
    channel="teams",
    content={"title": "What should this quarter be about?", "body": "Pick one."},
    address="29:u1",
    buttons=(
        Button("grow", "Grow my team", style="primary"),
        Button("stop", "Stop", action="stop_series", style="danger"),
        Button("plain", "Plain"),
    ),
)


def test_a_card_has_the_catalog_labels_as_execute_actions_with_a_submit_fallback():
    card = to_card(MESSAGE)
    assert (card["type"], card["version"]) == ("AdaptiveCard", "1.4")
    assert [b["text"] for b in card["body"]] == ["What should this quarter be about?", "Pick one."]
    expected = [
        ("Grow my team", "grow", "positive"),
        ("Stop", "stop", "destructive"),
        ("Plain", "plain", None),
    ]
    for action, (label, key, style) in zip(card["actions"], expected, strict=True):
        data = {"clarion": ButtonValue("u1", 41, key).encode()}
        assert (
            action["type"],
            action["title"],
            action["verb"],
            action["data"],
            action.get("style"),
        ) == ("Action.Execute", label, "clarion", data, style)
        assert action["fallback"] == {
            "type": "Action.Submit",
            "title": label,
            "data": data,
            **({"style": style} if style else {}),
        }


@pytest.mark.parametrize(
    ("content", "buttons", "texts", "has_actions"),
    [
        ({"title": "T", "body": "B"}, (), ["T", "B"], False),
        ({"body": "only body"}, (Button("a", "A"),), ["only body"], True),
        ({"title": "", "body": "B"}, (Button("a", "A"),), ["B"], True),
    ],
)
def test_card_shapes(content, buttons, texts, has_actions):
    card = to_card(Message(1, "u", "t", "o", "teams", content, buttons=buttons))
    assert [b["text"] for b in card["body"]] == texts
    assert ("actions" in card) is has_actions


def test_an_answered_card_replaces_the_actions_with_the_catalog_label():
    card = answered_card(MESSAGE, "Grow my team")
    assert "actions" not in card
    assert [b["text"] for b in card["body"]] == [
        "What should this quarter be about?",
        "Pick one.",
        "Answered: Grow my team",
    ]


def _activity(kind: str, **fields: Any) -> Activity:
    return Activity(type=kind, from_property=ChannelAccount(id="29:x"), **fields)


def _execute(verb: Any, data: Any) -> Activity:
    return _activity(
        "invoke",
        name="adaptiveCard/action",
        value={
            "action": {"type": "Action.Execute", "verb": verb, "data": data},
            "trigger": "manual",
        },
    )


@pytest.mark.parametrize(
    ("activity", "expected"),
    [
        (_execute("clarion", {"clarion": "v"}), TeamsAction("click", "execute", "29:x", "v")),
        (_execute("clarion", {"clarion": 42}), TeamsAction("click", "execute", "29:x", 42)),
        (_execute("clarion", "not a dict"), TeamsAction("click", "execute", "29:x", None)),
        (_execute("clarion", None), TeamsAction("click", "execute", "29:x", None)),
        (_execute(None, {"clarion": "v"}), TeamsAction("click", "execute", "29:x", "v")),
        (
            _execute("clarion_preferences", {"clarion_preferences": "save", "type:a": "true"}),
            TeamsAction(
                "preferences_save",
                "execute",
                "29:x",
                {"clarion_preferences": "save", "type:a": "true"},
            ),
        ),
        (
            _execute("clarion_preferences", {"clarion_preferences": "open"}),
            TeamsAction("preferences_open", "execute", "29:x"),
        ),
        (_execute("host_verb", {"host": 1}), None),
        (_activity("invoke", name="adaptiveCard/action", value={"action": "x"}), None),
        (_activity("invoke", name="adaptiveCard/action", value=None), None),
        (
            _activity(
                "invoke", name="composeExtension/query", value={"action": {"verb": "clarion"}}
            ),
            None,
        ),
        (_activity("message", value={"clarion": "v"}), TeamsAction("click", "submit", "29:x", "v")),
        (
            _activity("message", value={"clarion": None}),
            TeamsAction("click", "submit", "29:x", None),
        ),
        (_activity("message", value={"host_card": "v"}), None),
        (_activity("message", text="preferences"), TeamsAction("preferences_open", "text", "29:x")),
        (
            _activity("message", text=" <at>clarion</at> Preferences "),
            TeamsAction("preferences_open", "text", "29:x"),
        ),
        (_activity("message", text="preferences please"), None),
        (_activity("message", text="hello"), None),
        (_activity("conversationUpdate"), None),
        (Activity(type="message", value={"clarion": "v"}), TeamsAction("click", "submit", "", "v")),
    ],
)
def test_from_activity(activity, expected):
    assert from_activity(activity) == expected


def test_the_preferences_command_can_be_switched_off():
    assert from_activity(_activity("message", text="preferences"), command=None) is None


CHOICES = [("stalled_plan", "Stalled plan", True), ("milestone", "Milestone", False)]


@pytest.mark.parametrize(
    ("data", "changes"),
    [
        (
            {"type:stalled_plan": "false"},
            {"type:stalled_plan": False, "type:stalled_plan/teams": None},
        ),
        (
            {"type:milestone": "true", "type:stalled_plan": "true"},
            {"type:milestone": True, "type:milestone/teams": None},
        ),
        ({"type:milestone": True}, {"type:milestone": True, "type:milestone/teams": None}),
        ({"type:stalled_plan": "maybe", "type:milestone": 1}, {}),
        (
            {"type:receipt": "false", "all": "false", "category:activation": "false"},
            {},
        ),  # only offered types
        ({}, {}),
    ],
)
def test_preferences_changes(data, changes):
    assert preferences_changes(data, CHOICES) == changes


@pytest.mark.parametrize(
    ("status", "headers", "body", "kind", "reason", "after"),
    [
        (429, {"Retry-After": "30"}, "", ThrottledError, "http_429", 30.0),
        (429, {}, "", ThrottledError, "http_429", None),
        (503, {"Retry-After": "soon"}, "", TransientSendError, "http_503", None),
        (500, {}, "", TransientSendError, "http_500", None),
        (401, {}, "", TransientSendError, "http_401", None),
        (
            403,
            {},
            '{"error": {"code": "BotNotInConversationRoster", "message": "gone"}}',
            PermanentSendError,
            "http_403",
            None,
        ),
        (404, {}, "not json", PermanentSendError, "http_404", None),
        (400, {}, '{"error": {"code": "BadArgument"}}', PermanentSendError, "http_400", None),
    ],
)
def test_send_error(status, headers, body, kind, reason, after):
    error = send_error(status, headers, body)
    assert type(error) is kind and error.reason == reason
    assert getattr(error, "retry_after", None) == after


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            '{"serviceUrl": "https://smba.example/emea/", "conversationId": "a:1", "tenantId": "t", "botId": "28:b"}',
            ConversationRef("https://smba.example/emea/", "a:1", "t", "28:b"),
        ),
        ('{"serviceUrl": "ftp://x/", "conversationId": "a:1"}', None),
        ('{"serviceUrl": "https://x/", "conversationId": ""}', None),
        (
            '{"serviceUrl": "https://x/", "conversationId": "a", "tenantId": 5}',
            ConversationRef("https://x/", "a"),
        ),
        ("[1]", None),
        ("nope", None),
        ("", None),
        (None, None),
    ],
)
def test_conversation_references(raw, expected):
    assert ConversationRef.from_json(raw) == expected
    if expected is not None:
        assert ConversationRef.from_json(expected.to_json()) == expected


@pytest.mark.parametrize(
    ("conversation", "activity"),
    [
        ("a:1abc-personal", "1700000000001"),
        (
            "a:1abc-personal",
            "1:14V-AqmDStlQxcTuiOQ27qP6ve1JumC1vAjiLvYOpLNLA0LhO1T4Q_kxmr8fMe-QI",
        ),  # Teams does this
        ("19:abc@thread.tacv2;messageid=1581515441234", "1581515441235"),
        ("50%:odd/id", "x"),
    ],
)
def test_message_ids_survive_colons_on_both_sides(conversation, activity):
    assert split_message_id(message_id(conversation, activity)) == (conversation, activity)


@pytest.mark.parametrize("value", ["nocolon", ":17", "a%3A1:", "", None])
def test_message_ids_that_name_no_activity(value):
    assert split_message_id(value) is None


# --- the botbuilder 4.17.1 invoke bug ------------------------------------------------------------


class _Config:
    APP_ID = ""
    APP_PASSWORD = ""


class _CardBot(ActivityHandler):
    async def on_adaptive_card_invoke(
        self, turn_context, invoke_value
    ) -> AdaptiveCardInvokeResponse:
        return AdaptiveCardInvokeResponse(
            status_code=200,
            type="application/vnd.microsoft.card.adaptive",
            value={"type": "AdaptiveCard", "version": "1.4", "body": []},
        )


async def _post_invoke(adapter: CloudAdapter) -> tuple[int, str]:
    bot = _CardBot()

    async def messages(request):
        return await adapter.process(request, bot)

    app = aiohttp_web.Application()
    app.router.add_post("/api/messages", messages)
    invoke = {
        "type": "invoke",
        "name": "adaptiveCard/action",
        "id": "1",
        "channelId": "msteams",
        "serviceUrl": "http://127.0.0.1:9/",
        "from": {"id": "29:u"},
        "recipient": {"id": BOT},
        "conversation": {"id": "a:c", "conversationType": "personal"},
        "value": {
            "action": {"type": "Action.Execute", "verb": "x", "data": {}},
            "trigger": "manual",
        },
    }
    async with AiohttpClient(AiohttpServer(app)) as client:
        response = await client.post("/api/messages", json=invoke)
        return response.status, await response.text()


def test_the_stock_cloud_adapter_answers_an_invoke_with_500_and_clarions_answers_the_card(caplog):
    stock = CloudAdapter(ConfigurationBotFrameworkAuthentication(_Config()))
    status, _ = asyncio.run(_post_invoke(stock))
    assert status == 500
    assert "'dict' object has no attribute 'is_xml_model'" in caplog.text

    ours = web_teams.ClarionCloudAdapter(ConfigurationBotFrameworkAuthentication(_Config()))
    status, body = asyncio.run(_post_invoke(ours))
    assert status == 200
    assert json.loads(body) == {
        "statusCode": 200,
        "type": "application/vnd.microsoft.card.adaptive",
        "value": {"type": "AdaptiveCard", "version": "1.4", "body": []},
    }


# --- fixtures and helpers for the end-to-end tests -----------------------------------------------


def submit(
    value: Any, connector: FakeConnector, *, reply_to: str | None = None, **kw: Any
) -> dict[str, Any]:
    """What Teams sends for an Action.Submit press: a message whose value is the card data."""
    return teams_activity("message", connector, value={"clarion": value}, replyToId=reply_to, **kw)


def interactions() -> list[tuple[str, str, str | None]]:
    return [
        (r["outcome"], r["reason"], r["answer"])
        for r in rows("SELECT outcome, reason, answer FROM interactions ORDER BY id")
    ]


def card_texts(card: dict) -> list[str]:
    return [b.get("text") for b in card["body"] if b["type"] == "TextBlock"]


# --- sending ----------------------------------------------------------------------------------------


def test_a_recipient_with_only_a_teams_address_gets_the_nudge_as_an_adaptive_card(mia, connector):
    reference = json.loads(
        rows("SELECT addresses FROM recipients")[0]["addresses"]["teams_conversation"]
    )
    assert reference == {
        "serviceUrl": connector.url,
        "conversationId": CONVERSATION,
        "tenantId": "tenant-1",
        "botId": BOT,
        "channelId": "msteams",
    }
    key = delivered()
    [sent] = connector.sent
    assert sent.conversation_id == CONVERSATION
    assert "Authorization" not in sent.headers  # local mode: no token
    assert (sent.payload["type"], sent.payload["summary"]) == ("message", "Welcome to Grow 2026")
    card = sent.card
    assert card_texts(card) == [
        "Welcome to Grow 2026",
        "Hi Mia, your growth plan starts today. Ready to pick your first focus?",
    ]
    assert [a["title"] for a in card["actions"]] == KICKOFF_LABELS
    assert [a["fallback"]["title"] for a in card["actions"]] == KICKOFF_LABELS
    assert [decode_value(a["data"]["clarion"]) for a in card["actions"]] == [
        ButtonValue(MIA, key[1], "start"),
        ButtonValue(MIA, key[1], "later"),
    ]
    row = delivery(key)
    assert (row["state"], row["platform"], row["provider_message_id"]) == (
        "sent",
        "teams",
        message_id(CONVERSATION, sent.answer_id),
    )
    assert rows("SELECT channel, reason FROM decisions WHERE channel = 'slack'") == [
        {"channel": "slack", "reason": "no_adapter"}
    ]


def test_a_recipient_who_never_talked_to_the_bot_fails_with_a_reason(teams, connector):
    register_recipient("ned", timezone="UTC", addresses={"teams": "29:ned"})
    key = nudge("ned")  # the route's own send: no conversation to write to
    assert delivery(key)["state"] == "failed"
    assert rows("SELECT reason FROM decisions WHERE gate = 'deliver'") == [
        {"reason": "no_conversation"}
    ]
    assert connector.calls == []


def test_registering_her_again_keeps_the_conversation_while_her_teams_id_stays(mia, connector):
    def stored() -> str | None:
        return rows("SELECT addresses FROM recipients")[0]["addresses"].get("teams_conversation")

    learned = stored()
    register_recipient(
        MIA, timezone="Europe/Paris", addresses={"teams": MIA_TEAMS, "email": "mia@example.com"}
    )
    assert stored() == learned  # a host's nightly directory sync must not cut her off
    assert delivered()
    register_recipient(MIA, timezone="Europe/Paris", addresses={"teams": "29:1another-account"})
    assert stored() is None  # another Teams account: that conversation is not hers


def test_group_chats_and_strangers_leave_no_conversation_reference(mia, client, connector):
    before = rows("SELECT addresses FROM recipients")
    post(
        client,
        teams_activity(
            "message", connector, text="hi", conversation="19:group@thread.v2", scope="groupChat"
        ),
    )
    post(
        client,
        teams_activity("message", connector, text="hi", conversation="a:eve", user=EVE_TEAMS),
    )
    assert rows("SELECT addresses FROM recipients") == before


# --- clicks -----------------------------------------------------------------------------------------


def test_a_click_answers_the_nudge_and_the_card_is_updated_in_place(mia, client, connector):
    key = delivered()
    card_id = connector.sent[0].answer_id
    response = post(client, execute(value(key, "start"), connector, reply_to=card_id))
    assert response.status_code == 200
    body = response.json()
    assert (body["statusCode"], body["type"]) == (200, "application/vnd.microsoft.card.adaptive")
    assert card_texts(body["value"])[-1] == "Answered: Let's go" and "actions" not in body["value"]
    [update] = connector.updates
    assert (update.conversation_id, update.activity_id, update.card) == (
        CONVERSATION,
        card_id,
        body["value"],
    )
    row = delivery(key)
    assert (row["state"], row["answer"], row["answered_by"]) == (
        "answered",
        "start",
        f"teams:{MIA_TEAMS}",
    )

    # a second click, another answer, through the Action.Submit fallback: the first answer stands
    response = post(client, submit(value(key, "later"), connector, reply_to=card_id))
    assert response.status_code == 201
    assert delivery(key)["answer"] == "start"
    assert [card_texts(u.card)[-1] for u in connector.updates] == ["Answered: Let's go"] * 2
    assert interactions() == [
        ("accepted", "answer", "start"),
        ("repeated", "already_answered", "later"),
    ]


def test_a_first_click_through_submit_is_accepted_too(mia, client, connector):
    key = delivered()
    assert post(client, submit(value(key, "later"), connector)).status_code == 201
    assert delivery(key)["answer"] == "later"
    assert [card_texts(u.card)[-1] for u in connector.updates] == ["Answered: Not this week"]


def test_a_send_teams_accepts_without_an_id_is_answered_through_the_invoke_response(
    mia, client, connector
):
    connector.fail_next(202)
    key = delivered()
    assert delivery(key)["provider_message_id"] is None
    response = post(client, execute(value(key, "start"), connector))
    assert card_texts(response.json()["value"])[-1] == "Answered: Let's go"
    assert delivery(key)["answer"] == "start" and connector.updates == []


def test_forged_foreign_and_malformed_clicks_change_nothing_and_are_recorded(
    mia, client, connector
):
    key = delivered()
    before = delivery(key)
    cases = [  # (button value, clicking Teams user, recorded reason, recorded answer)
        (value(key, "hack"), MIA_TEAMS, "unknown_answer", "hack"),
        (ButtonValue(MIA, key[1] + 1000, "start").encode(), MIA_TEAMS, "unknown_delivery", "start"),
        (ButtonValue("eve", key[1], "start").encode(), MIA_TEAMS, "unknown_delivery", "start"),
        (value(key, "start"), EVE_TEAMS, "foreign_user", "start"),
        ('{"u":"mia","d":1', MIA_TEAMS, "malformed", None),
        (42, MIA_TEAMS, "malformed", None),
        ({"u": MIA, "d": key[1], "a": "start"}, MIA_TEAMS, "malformed", None),
        (None, MIA_TEAMS, "malformed", None),
        ("x" * 5000, MIA_TEAMS, "malformed", None),
    ]
    for raw, user, _reason, _answer in cases:
        response = post(client, execute(raw, connector, user=user))
        assert (response.status_code, response.json()) == (
            200,
            {
                "statusCode": 200,
                "type": "application/vnd.microsoft.activity.message",
                "value": web_teams.NOT_VALID,
            },
        )
        assert post(client, submit(raw, connector, user=user)).status_code == 201
    assert delivery(key) == before
    assert connector.updates == []
    assert interactions() == [
        ("rejected", reason, answer)
        for _raw, _user, reason, answer in cases
        for _via in ("execute", "submit")
    ]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=40),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=8,
    ),
    via=st.sampled_from(["execute", "submit"]),
)
def test_fuzzed_teams_payloads_never_raise_and_never_change_a_delivery(mia, connector, data, via):
    delivered_before, recorded = (
        rows("SELECT id, state, answer FROM deliveries"),
        count("interactions"),
    )
    activity = Activity().deserialize(
        execute(data, connector) if via == "execute" else submit(data, connector)
    )
    adapter = TestAdapter(template_or_conversation=activity)
    assert asyncio.run(_run(adapter, activity)) is True
    assert rows("SELECT id, state, answer FROM deliveries") == delivered_before
    assert count("interactions") == recorded + 1
    assert rows("SELECT outcome FROM interactions ORDER BY id DESC LIMIT 1") == [
        {"outcome": "rejected"}
    ]
    assert adapter.updated_activities == []


async def _run(adapter: TestAdapter, activity: Activity) -> bool:
    outcome: list[bool] = []

    async def logic(turn_context: TurnContext) -> None:
        outcome.append(await web_teams.handle_teams_activity(turn_context))

    await adapter.run_pipeline(TurnContext(adapter, activity), logic)
    return outcome[0]


# --- provider failures ----------------------------------------------------------------------------


def test_a_429_is_retried_after_retry_after_and_sent_once(mia, connector):
    with frozen_clock() as clk:
        connector.fail_next(429, retry_after=30)
        start = clk.now
        key = nudge()  # the route's own send gets the 429
        row = delivery(key)
        assert (row["state"], row["attempts"], row["last_error"][:8]) == ("pending", 0, "http_429")
        assert (
            30 <= row["not_before"].timestamp() - start.timestamp() <= 36
        )  # Retry-After, jittered up
        clk.advance(29)
        assert tick()["deliveries"] == 0
        clk.advance(7)
        assert tick()["deliveries"] == 1
        drain("activation")
        assert deliver([key[0]], [key[1]]) == 1
    assert delivery(key)["state"] == "sent"
    assert [c.status for c in connector.calls if c.activity_id is None] == [429, 201]
    assert len(connector.sent) == 1


def test_a_429_pauses_the_conversation_for_every_worker(mia, connector):
    with frozen_clock() as clk:
        connector.fail_next(429, retry_after=5)
        first = nudge()  # the route's own send gets the 429
        assert delivery(first)["state"] == "pending"
        second = nudge(  # the route's own send: paused, the provider is not asked
            type_key="weekly_one_on_one",
            event="w1",
            variables={"first_name": "Mia", "report_name": "Ola"},
        )
        assert delivery(second)["state"] == "pending"
        assert delivery(second)["last_error"].startswith("paused")
        assert [c.status for c in connector.calls if c.activity_id is None] == [429]
        clk.advance(6.01)  # the pause, and at most a fifth of it in jitter
        assert deliver([second[0]], [second[1]]) == 1
    assert len(connector.sent) == 1


def test_a_403_fails_the_delivery_and_suppresses_the_address_until_she_is_back(
    mia, client, connector
):
    connector.remove_bot(CONVERSATION)
    key = nudge()  # the route's own send: the bot was removed (403)
    assert delivery(key)["state"] == "failed"
    assert [
        (d["gate"], d["outcome"], d["reason"])
        for d in rows("SELECT gate, outcome, reason FROM decisions WHERE gate = 'deliver'")
    ] == [("deliver", "failed", "http_403")]
    assert rows("SELECT user_id, channel, address, reason FROM suppressions") == [
        {"user_id": MIA, "channel": "teams", "address": MIA_TEAMS, "reason": "deactivated"}
    ]

    later = notify(
        MIA, "weekly_one_on_one", event_id="w1", variables={"first_name": "Mia", "report_name": "O"}
    )
    route([MIA], [later.request_id])
    assert rows(
        "SELECT reason FROM decisions WHERE request_id = :r AND channel = 'teams'",
        r=later.request_id,
    ) == [{"reason": "suppressed_address"}]

    connector.gone.clear()  # she installs the bot again and says hello
    post(client, teams_activity("message", connector, text="hi again"))
    assert count("suppressions") == 0


# --- the adapter on its own -------------------------------------------------------------------------


class _Store:
    def __init__(self, ref: ConversationRef | None) -> None:
        self.ref = ref
        self.gone_calls: list[tuple[str, str]] = []

    def reference(self, user_id: str, teams_user: str) -> ConversationRef | None:
        return self.ref

    def gone(self, user_id: str, teams_user: str, detail: str) -> None:
        self.gone_calls.append((user_id, teams_user))


def test_update_replaces_the_card_and_refuses_a_bad_message_id(connector):
    adapter = TeamsAdapter(
        credentials=credentials_for("none", None, None),
        store=_Store(ConversationRef(connector.url, CONVERSATION)),
    )
    sent = adapter.send(MESSAGE)
    adapter.update(MESSAGE, sent.provider_message_id, "Grow my team")
    adapter.update(MESSAGE, sent.provider_message_id, None)
    assert [card_texts(u.card)[-1] for u in connector.updates] == [
        "Answered: Grow my team",
        "Pick one.",
    ]
    assert "actions" in connector.updates[1].card
    with pytest.raises(PermanentSendError, match="bad_message_id"):
        adapter.update(MESSAGE, "no-colon", "x")
    with pytest.raises(PermanentSendError, match="http_404"):  # an activity the connector never saw
        adapter.update(MESSAGE, message_id(CONVERSATION, "999"), "x")
    assert not hasattr(adapter, "reconcile")  # Teams cannot be asked for an earlier message


def test_connection_failures_are_transient_and_not_retried_inside_the_sdk():
    adapter = TeamsAdapter(
        credentials=credentials_for("none", None, None),
        store=_Store(ConversationRef("http://127.0.0.1:9/", CONVERSATION)),
    )
    started = time.monotonic()
    with pytest.raises(TransientSendError, match="connection"):
        adapter.send(MESSAGE)
    assert time.monotonic() - started < 1  # msrest's default policy would back off ~5 s


def test_5xx_reaches_the_ledger_without_sdk_retries_unknown_for_a_post(connector):
    adapter = TeamsAdapter(
        credentials=credentials_for("none", None, None),
        store=_Store(ConversationRef(connector.url, CONVERSATION)),
    )
    sent = adapter.send(MESSAGE)
    connector.fail_next(503, retry_after=1)
    with pytest.raises(UnknownSendError, match="http_503"):  # it may have been posted
        adapter.send(MESSAGE)
    connector.fail_next(503, retry_after=1)
    with pytest.raises(TransientSendError, match="http_503"):  # an update is safe to repeat
        adapter.update(MESSAGE, sent.provider_message_id, "x")
    assert [c.status for c in connector.calls] == [201, 503, 503]


@pytest.fixture
def redis_client(clarion_env) -> redis.Redis:
    return redis.Redis.from_url(clarion_env.redis_url)


def test_the_adapter_waits_briefly_for_its_budget_then_hands_back_to_the_queue(
    redis_client, connector
):
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the budget lives in Redis on real time: really wait
        slept.append(seconds)
        time.sleep(seconds)

    adapter = TeamsAdapter(
        credentials=credentials_for("none", None, None),
        store=_Store(ConversationRef(connector.url, CONVERSATION)),
        limits=RateLimits(lambda: redis_client, prefix=f"test:{uuid.uuid4().hex}"),
        quota=Quota("teams", ((2, 1.0), (3, 10.0)), share=1.0),
        sleep=sleep,
    )
    adapter.send(MESSAGE)
    adapter.send(MESSAGE)
    adapter.send(MESSAGE)  # waits out the 1 s window
    assert len(slept) == 1 and 0.5 < slept[0] <= 1.0
    with pytest.raises(ThrottledError, match="budget_full") as raised:
        adapter.send(MESSAGE)  # the 10 s window is too long to wait in a worker
    assert 8.0 < raised.value.retry_after <= 10.0
    assert len(connector.sent) == 3


def test_a_budget_outage_does_not_stop_sends(connector):
    unreachable = redis.Redis(
        host="127.0.0.1", port=9, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    adapter = TeamsAdapter(
        credentials=credentials_for("none", None, None),
        store=_Store(ConversationRef(connector.url, CONVERSATION)),
        limits=RateLimits(lambda: unreachable),
    )
    assert adapter.send(MESSAGE).provider_message_id
    connector.fail_next(429, retry_after=3)
    with pytest.raises(TransientSendError, match="http_429"):
        adapter.send(MESSAGE)


# --- Bot Framework authentication ------------------------------------------------------------------


def test_with_an_app_id_a_bad_token_gets_401_and_changes_nothing(mia, connector, monkeypatch):
    key = delivered()
    configure(monkeypatch, teams_app_id="11111111-app", teams_app_password="secret")
    before = (delivery(key), rows("SELECT addresses FROM recipients"), len(connector.calls))
    with FakeConnector() as attacker, TestClient(create_app()) as client:  # a forged serviceUrl
        forged = jwt.encode(
            {
                "iss": "https://api.botframework.com",
                "aud": "11111111-app",
                "serviceurl": attacker.url,
                "exp": int(time.time()) + 300,
            },
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            algorithm="RS256",
            headers={"kid": "forged"},
        )
        click = execute(value(key, "start"), attacker)
        for token in (None, "garbage", "a.b.c", forged):
            assert post(client, click, token).status_code == 401
        response = client.post(
            "/api/messages", json=click, headers={"Authorization": "Basic bWlhOnB3"}
        )
        assert response.status_code == 401
        assert post(client, submit(value(key, "start"), attacker)).status_code == 401
        assert (
            post(client, teams_activity("message", attacker, text="preferences")).status_code == 401
        )
    assert (delivery(key), rows("SELECT addresses FROM recipients"), len(connector.calls)) == before
    assert attacker.calls == [] and interactions() == []


def test_without_a_teams_app_id_the_endpoint_is_not_there(mia, connector, monkeypatch):
    key = delivered()
    configure(monkeypatch, teams_app_id=None)
    with TestClient(create_app()) as client:
        assert post(client, execute(value(key, "start"), connector)).status_code == 404
    assert delivery(key)["state"] == "sent" and interactions() == []


def test_a_host_turn_nobody_authenticated_is_ignored_outside_local_mode(
    mia, connector, monkeypatch
):
    key = delivered()
    configure(monkeypatch, teams_app_id="11111111-app", teams_app_password="secret")
    for activity in (
        execute(value(key, "start"), connector),
        submit(value(key, "start"), connector),
        teams_activity("message", connector, text="preferences"),
    ):
        parsed = Activity().deserialize(activity)
        adapter = TestAdapter(template_or_conversation=parsed)  # no claims identity on the turn
        assert asyncio.run(_run(adapter, parsed)) is True
        assert [
            a.value.body["value"] for a in adapter.activity_buffer if a.type == "invokeResponse"
        ] == ([web_teams.NOT_VALID] if parsed.type == "invoke" else [])
        assert [a for a in adapter.activity_buffer if a.type != "invokeResponse"] == []
    assert delivery(key)["state"] == "sent" and interactions() == []


def test_a_token_signed_by_the_channels_key_is_accepted_and_others_are_not(
    mia, connector, monkeypatch
):
    key = delivered()
    configure(monkeypatch, teams_app_id="11111111-app", teams_app_password="secret")
    private, jwks = signing_keys()
    adapter = web_teams.build_adapter(openid_metadata_url=connector.serve_keys(jwks))
    app = Starlette(routes=web_teams.routes(adapter=adapter))

    def token(signer: Any = private, **claims: Any) -> str:
        body = {
            "iss": "https://api.botframework.com",
            "aud": "11111111-app",
            "serviceurl": connector.url,
            "exp": int(time.time()) + 300,
            "nbf": int(time.time()) - 10,
            **claims,
        }
        return jwt.encode(body, signer, algorithm="RS256", headers={"kid": "k1"})

    forged = execute(
        ButtonValue(MIA, key[1], "hack").encode(), connector
    )  # rejected: no outbound call
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with TestClient(app) as client:
        assert post(client, forged, token()).status_code == 200
        assert post(client, forged, token(other_key)).status_code == 401
        assert post(client, forged, token(aud="someone-else")).status_code == 401
        assert post(client, forged, token(serviceurl="https://evil.example/")).status_code == 401
        assert post(client, forged, token(exp=int(time.time()) - 3600)).status_code == 401
    assert interactions() == [("rejected", "unknown_answer", "hack")]
    assert delivery(key)["state"] == "sent"


# --- a host's own bot ---------------------------------------------------------------------------------


class HostBot(ActivityHandler):
    """A host's existing Teams bot that mounts clarion with one line in on_turn."""

    def __init__(self) -> None:
        self.own: list[str] = []

    async def on_turn(self, turn_context: TurnContext) -> None:
        if await web_teams.handle_teams_activity(turn_context):
            return
        await super().on_turn(turn_context)

    async def on_message_activity(self, turn_context: TurnContext) -> None:
        self.own.append(turn_context.activity.text or json.dumps(turn_context.activity.value))
        await turn_context.send_activity("host here")


class PerTypeHostBot(HostBot):
    """A host that calls clarion from on_message_activity and on_invoke_activity instead."""

    async def on_turn(self, turn_context: TurnContext) -> None:
        await ActivityHandler.on_turn(self, turn_context)

    async def on_message_activity(self, turn_context: TurnContext) -> None:
        if await web_teams.handle_teams_activity(turn_context):
            return
        await super().on_message_activity(turn_context)

    async def on_invoke_activity(self, turn_context: TurnContext):
        if await web_teams.handle_teams_activity(turn_context):
            return None  # clarion has answered the invoke
        return await super().on_invoke_activity(turn_context)


@pytest.mark.parametrize("host_class", [HostBot, PerTypeHostBot])
def test_a_host_bot_hands_clarions_activities_to_clarion_and_keeps_its_own(
    mia, connector, host_class
):
    key = delivered()
    card_id = connector.sent[0].answer_id
    host = host_class()
    template = Activity(
        channel_id="msteams",
        service_url=connector.url,
        from_property=ChannelAccount(id=MIA_TEAMS),
        recipient=ChannelAccount(id=BOT),
        conversation=ConversationAccount(id=CONVERSATION, conversation_type="personal"),
    )
    adapter = TestAdapter(host.on_turn, template)

    async def scenario() -> None:
        for activity in (
            Activity().deserialize(execute(value(key, "start"), connector)),
            Activity(type="message", text="hello host"),
            Activity(type="message", value={"host_card": "approve"}),
            Activity().deserialize(submit(value(key, "later"), connector)),
            Activity().deserialize(invoke({"host": 1}, connector, verb="host_verb")),
        ):
            await adapter.receive_activity(activity)

    asyncio.run(scenario())
    assert host.own == ["hello host", '{"host_card": "approve"}']
    assert [a.text for a in adapter.activity_buffer if a.type == "message"] == ["host here"] * 2
    assert delivery(key)["answer"] == "start"
    assert [
        (u.id, card_texts(u.attachments[0].content)[-1]) for u in adapter.updated_activities
    ] == [(card_id, "Answered: Let's go")] * 2  # the click, then the Submit that found it answered
    invoke_responses = [a.value for a in adapter.activity_buffer if a.type == "invokeResponse"]
    assert [r.status for r in invoke_responses] == [
        200,
        501,
    ]  # clarion's card; the host's own invoke
    assert invoke_responses[0].body["value"] == adapter.updated_activities[0].attachments[0].content
    assert interactions() == [
        ("accepted", "answer", "start"),
        ("repeated", "already_answered", "later"),
    ]


# --- preferences -------------------------------------------------------------------------------------


def test_the_preferences_card_lists_her_types_and_saves_toggles(mia, client, connector):
    assert post(client, teams_activity("message", connector, text="preferences")).status_code == 201
    reply = connector.replies[-1]
    toggles = {i["id"]: i["value"] for i in reply.card["body"] if i["type"] == "Input.Toggle"}
    titles = {i["id"]: i["title"] for i in reply.card["body"] if i["type"] == "Input.Toggle"}
    assert titles["type:stalled_plan"] == "A quiet plan"  # the catalog's label, not the key
    assert toggles == {
        f"type:{k}": "true"
        for k in (
            "plan_kickoff",
            "weekly_one_on_one",
            "stalled_plan",
            "goal_prompt",
            "feedback_request",
            "milestone",
            "weekly_digest",
            "plan_ending",
        )
    }
    assert reply.card["actions"][0]["verb"] == "clarion_preferences"

    data = {
        **toggles,
        "clarion_preferences": "save",
        "type:stalled_plan": "false",
        "type:bogus": "false",
        "all": "false",
        "category:activation": "false",
    }
    response = post(
        client, teams_activity("message", connector, value=data, replyToId=reply.answer_id)
    )
    assert response.status_code == 201
    assert get_preferences(MIA)["settings"] == {"type:stalled_plan": False}
    [update] = connector.updates
    assert update.activity_id == reply.answer_id
    assert {i["id"]: i["value"] for i in update.card["body"] if i["type"] == "Input.Toggle"}[
        "type:stalled_plan"
    ] == "false"
    assert card_texts(update.card)[-1] == "Saved."

    request = notify(MIA, "stalled_plan", event_id="s1", variables={"first_name": "Mia"})
    route([MIA], [request.request_id])
    assert rows(
        "SELECT reason FROM decisions WHERE request_id = :r AND channel = 'teams'",
        r=request.request_id,
    ) == [{"reason": "opted_out"}]

    # the Action.Execute path answers with the refreshed card
    back_on = {"clarion_preferences": "save", "type:stalled_plan": "true"}
    response = post(client, invoke(back_on, connector, verb="clarion_preferences"))
    assert response.status_code == 200
    assert {
        i["id"]: i["value"] for i in response.json()["value"]["body"] if i["type"] == "Input.Toggle"
    }["type:stalled_plan"] == "true"
    assert get_preferences(MIA)["settings"] == {"type:stalled_plan": True}


def test_a_stranger_asking_for_preferences_is_told_so(mia, client, connector):
    post(
        client,
        teams_activity(
            "message", connector, text="preferences", user=EVE_TEAMS, conversation="a:eve"
        ),
    )
    assert connector.replies[-1].payload["text"] == web_teams.UNKNOWN_USER
    assert count("preferences") == 0


def test_runtime_registers_the_teams_adapter_in_local_mode(teams):
    adapter = runtime.adapters()["teams"]
    assert (adapter.channel, adapter.needs_address) == ("teams", True)
    assert not adapter.credentials.microsoft_app_id
