"""The pure parts of the inbound doors, as tables: Slack's signature check on headers of any shape,
the Slack envelopes, the Teams activity shape, and `clarion web`'s local-mode bind check."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import parse_qsl, urlencode

import pytest

from clarion.errors import ClarionError, ConfigurationError
from clarion.standins.fake_slack import FakeSlack, block_actions, event_callback, sign
from clarion.web.app import check_bind, is_loopback
from clarion.web.inbound import Refused, json_value
from clarion.web.slack_envelope import (
    Action,
    BlockActions,
    EventCallback,
    SslCheck,
    Unhandled,
    UrlVerification,
    parse,
    verify,
)
from clarion.web.teams_envelope import check_bearer, probe, read_activity

SECRET = "s3cret"
BODY = b'{"type":"url_verification","challenge":"c"}'
NOW = 1_800_000_000
TEAM = FakeSlack.TEAM


def headers(
    timestamp: str = str(NOW), signature: str | None = None, body: bytes = BODY
) -> dict[str, str]:
    return {
        "x-slack-request-timestamp": timestamp,
        "x-slack-signature": sign(SECRET, timestamp, body) if signature is None else signature,
    }


def test_a_body_slack_signed_now_is_verified():
    verify(SECRET, headers(), BODY, now=NOW)
    verify(SECRET, headers(str(NOW - 300)), BODY, now=NOW)


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({}, "malformed"),
        ({"x-slack-request-timestamp": str(NOW)}, "malformed"),
        (headers(signature="v0=" + "0" * 64), "bad signature"),
        (headers(signature="v0=" + "A" * 64), "malformed"),
        (headers(signature="v1=" + "0" * 64), "malformed"),
        (headers(signature="v0=abc"), "malformed"),
        (headers(signature="v0=" + "0" * 10_000), "malformed"),
        (headers(timestamp=str(NOW - 301)), "stale"),
        (headers(timestamp=str(NOW + 301)), "stale"),
        (headers(timestamp="not-a-number"), "malformed"),
        (headers(timestamp="١٧٠٠٠٠٠٠٠٠"), "malformed"),  # digits int() would accept
        (headers(timestamp=" 1800000000"), "malformed"),
        (headers(timestamp="-1"), "malformed"),
        (headers(timestamp="9" * 5000), "malformed"),
        (headers(timestamp="1800000000.5"), "malformed"),
        (headers(timestamp="Ã©"), "malformed"),  # non-ASCII header bytes, as Starlette decodes them
    ],
)
def test_headers_of_any_shape_are_refused_with_401(given, reason):
    with pytest.raises(Refused, match=rf"^401: .*{re.escape(reason)}") as refused:
        verify(SECRET, given, BODY, now=NOW)
    assert refused.value.status == 401 and reason in refused.value.reason


def test_the_signature_covers_the_raw_bytes():
    body = '{"x":"é"}'.encode()
    verify(SECRET, headers(body=body), body, now=NOW)
    with pytest.raises(Refused, match=r"^401: bad signature$"):
        verify(SECRET, headers(body=body), body + b" ", now=NOW)


def form(payload: object) -> bytes:
    return urlencode(
        {"payload": payload if isinstance(payload, str) else json.dumps(payload)}
    ).encode()


FORM = "application/x-www-form-urlencoded"
CLICK = json.loads(
    dict(parse_qsl(block_actions("U1", "v", action_id="clarion:a").decode()))["payload"]
)


def test_the_envelopes_clarion_handles():
    assert parse(BODY, "application/json") == UrlVerification("c")
    click = parse(form(CLICK), FORM)
    assert isinstance(click, BlockActions)
    assert (click.user_id, click.channel_id, click.actions) == (
        "U1",
        "D0",
        (Action("clarion:a", "v", "clarion_answers", "button"),),
    )
    assert click.to_bolt() == {  # all Bolt and clarion's listeners will see
        "type": "block_actions",
        "user": {"id": "U1", "team_id": TEAM},
        "team": {"id": TEAM},
        "api_app_id": "ACLARION",
        "channel": {"id": "D0"},
        "container": {"type": "message", "channel_id": "D0", "message_ts": "1.000001"},
        "actions": [
            {
                "action_id": "clarion:a",
                "value": "v",
                "block_id": "clarion_answers",
                "type": "button",
            }
        ],
    }
    event = parse(
        event_callback({"type": "app_home_opened", "user": "U1", "tab": "home"}), "application/json"
    )
    assert isinstance(event, EventCallback) and (event.event.type, event.event.user) == (
        "app_home_opened",
        "U1",
    )
    assert parse(b"ssl_check=1&token=x", FORM) == SslCheck()
    assert parse(b"command=%2Fnudge&text=hi", FORM) == Unhandled("command")
    assert parse(form({"type": "view_submission"}), FORM) == Unhandled("view_submission")


def _with(**changes: object) -> dict:
    payload = json.loads(json.dumps(CLICK))
    for path, value in changes.items():
        target = payload
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = value
    return payload


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"\xff\xfe", "UTF-8"),
        (b"{not json", "not JSON"),
        (b"[" * 5000 + b"]" * 5000, "not JSON"),
        (b'{"type": "block_actions", "n": ' + b"1" * 5000 + b"}", "not JSON"),
        (b"[1, 2]", "payload"),
        (b'"just a string"', "payload"),
        (b'{"type": 5}', "type"),
        (b"payload=%ff", "form"),
        (form("{oops"), "not JSON"),
        (form([1]), "payload"),
        (form(_with(actions={"a": 1})), "actions"),
        (form(_with(actions=[])), "actions"),
        (form(_with(actions=[1])), "actions[0]"),
        (form(_with(actions__0__action_id=5)), "actions[0].action_id"),
        (form(_with(actions__0__block_id=[])), "actions[0].block_id"),
        (form(_with(actions__0__value={"a": "\x00"})), "actions[0].value"),
        (form(_with(actions__0__value="\ud800")), "actions[0].value"),
        (form(_with(user="U1")), "user"),
        (form(_with(user={"id": 7})), "user.id"),
        (form(_with(user={"id": "U1\x00"})), "user.id"),
        (form(_with(user={"id": "U1 OR 1=1"})), "user.id"),
        (form(_with(user={})), "user.id"),
        (form(_with(container=["D0"])), "container"),
        (form(_with(container__channel_id={"id": "D0"})), "container.channel_id"),
        (form(_with(channel="D0", container=None)), "channel"),
        (form(_with(team="T1")), "team"),
        (json.dumps({"type": "event_callback", "event": "app_home_opened"}).encode(), "event"),
        (json.dumps({"type": "event_callback", "event": {"type": 1}}).encode(), "event.type"),
        (
            json.dumps({"type": "event_callback", "event": {"type": "x", "user": ["U1"]}}).encode(),
            "event.user",
        ),
        (
            json.dumps({"type": "event_callback", "event": {"type": "x", "tab": {}}}).encode(),
            "event.tab",
        ),
        (json.dumps({"type": "url_verification", "challenge": 5}).encode(), "challenge"),
    ],
)
def test_malformed_signed_bodies_are_400_naming_the_field(body, field):
    with pytest.raises(Refused, match=rf"^400: .*{re.escape(field)}") as refused:
        parse(body, FORM if body.startswith(b"payload") else "application/json")
    assert refused.value.status == 400 and field in refused.value.reason


def test_any_json_value_is_checked_without_recursion():
    deep: object = "x"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(Refused, match="nested deeper"):
        json_value(deep, "value")
    assert json_value({"a": [1, None, 2.5, True, "ü"]}, "value") == {"a": [1, None, 2.5, True, "ü"]}


# --- Teams ---------------------------------------------------------------------------------------

ACTIVITY = {
    "type": "invoke",
    "name": "adaptiveCard/action",
    "id": "f:1",
    "channelId": "msteams",
    "serviceUrl": "https://smba.example/emea/",
    "from": {"id": "29:u", "name": "U"},
    "recipient": {"id": "28:bot"},
    "conversation": {"id": "a:1", "conversationType": "personal", "tenantId": "t"},
    "channelData": {"tenant": {"id": "t"}, "other": [1]},
    "attachments": "ignored",
    "value": {"action": {"type": "Action.Execute", "verb": "clarion", "data": {"clarion": "v"}}},
}


def test_a_well_formed_activity_is_rebuilt_from_the_fields_clarion_reads():
    activity = read_activity(ACTIVITY)
    assert (activity.type, activity.name, activity.from_property.id, activity.conversation.id) == (
        "invoke",
        "adaptiveCard/action",
        "29:u",
        "a:1",
    )
    assert activity.channel_data == {"tenant": {"id": "t"}} and activity.attachments is None
    assert activity.value == ACTIVITY["value"]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"value": "not an object"}, "value"),
        ({"value": [1]}, "value"),
        ({"value": {"action": "x"}}, "value.action"),
        ({"value": {}}, "value.action"),
        ({"value": {"action": {"verb": 1}}}, "value.action.verb"),
        ({"value": {"action": {"verb": "clarion", "data": 5}}}, "value.action.data"),
        ({"value": {"action": {"verb": "clarion", "data": [1]}}}, "value.action.data"),
        ({"from": "29:u"}, "from"),
        ({"from": {"id": 5}}, "from.id"),
        ({"from": {"id": "29:u\x00"}}, "from.id"),
        ({"conversation": []}, "conversation"),
        ({"conversation": {"id": "a:1", "conversationType": 1}}, "conversation.conversationType"),
        ({"channelData": {"tenant": "t"}}, "channelData.tenant"),
        ({"channelData": "x"}, "channelData"),
        ({"serviceUrl": 5}, "serviceUrl"),
        ({"serviceUrl": None}, "serviceUrl"),
        ({"serviceUrl": "ftp://x/"}, "serviceUrl"),
        ({"serviceUrl": "http://[::1"}, "serviceUrl"),
        ({"serviceUrl": "http://x:99999/"}, "serviceUrl"),
        ({"serviceUrl": "https:///path"}, "serviceUrl"),
        ({"serviceUrl": "https://x/\n"}, "serviceUrl"),
        ({"text": 5}, "text"),
        ({"text": "x" * 40_000}, "text"),
        ({"type": None}, "type"),
        ({"replyToId": {"id": 1}}, "replyToId"),
    ],
)
def test_malformed_activities_are_400_naming_the_field(changes, field):
    with pytest.raises(Refused, match=rf"^400: {re.escape(field)}:") as refused:
        read_activity({**ACTIVITY, **changes})
    assert refused.value.status == 400 and refused.value.reason.startswith(field + ":")


@pytest.mark.parametrize("data", [None, 5, "x", [ACTIVITY], {"recipient": "r", "serviceUrl": 7}])
def test_probing_unchecked_json_for_authentication_never_raises(data):
    assert probe(data).service_url in (None, ACTIVITY["serviceUrl"])


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic bWlhOnB3",
        "Bearer",
        "Bearer a.b",
        "Bearer a.b.c d",
        "Bearer ä.b.c",
        "Bearer " + "a" * 20_000 + ".b.c",
    ],
)
def test_a_missing_or_malformed_bearer_token_is_401(header):
    with pytest.raises(Refused, match=r"^401: missing or malformed bearer token$") as refused:
        check_bearer(header)
    assert refused.value.status == 401


def test_a_jwt_shaped_bearer_token_passes_to_the_real_check():
    check_bearer("Bearer eyJhbGciOi.eyJpc3Mi.c2ln-_")


# --- clarion web in local mode -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_local_mode_warns_and_refuses_a_public_bind_unless_told():
    assert check_bind("0.0.0.0", "11111111-app") is None
    assert check_bind("0.0.0.0", None) is None
    warning = check_bind("127.0.0.1", "none")
    assert warning and "NOT authenticated" in warning and "\n" not in warning
    with pytest.raises(ConfigurationError, match="--allow-insecure-teams") as refused:
        check_bind("0.0.0.0", "None")
    assert isinstance(refused.value, ClarionError)
    assert check_bind("0.0.0.0", "none", allow_insecure_teams=True) == warning


def test_timestamps_are_compared_with_the_clock_given():
    verify(SECRET, headers(str(int(time.time()))), BODY, now=time.time())
