"""The inbound doors through clarion's real HTTP app (Starlette's TestClient on web.app): size first,
then who sent it, then shape, each refusal a short 4xx; Teams cards that show variables as text;
Teams local mode, which keeps a stored conversation from being rewritten from another origin and
is loud about itself in `clarion web`; and the app served as a process, by `clarion web` and by
`uvicorn web.app:app`.

Real PostgreSQL and Redis, the real slack_bolt / botbuilder stacks, the local Slack Web API
(standins/fake_slack.py) and Bot Framework connector (clarion/standins/fake_connector.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
import jwt
import pytest
from markdown_it import MarkdownIt
from starlette.applications import Starlette
from starlette.testclient import TestClient

from clarion.records import ButtonValue
from clarion.standins.fake_connector import FakeConnector
from clarion.standins.fake_slack import block_actions, signed
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.web import teams as web_teams
from clarion.web.app import create_app
from tests.support.environment import ROOT
from tests.support.pipeline import configure, count, drain, rows
from tests.support.slack import (
    FORM,
    SECRET,
    ana,
    fake,
    slack_env,
)
from tests.support.teams import (
    CONVERSATION,
    MIA,
    MIA_TEAMS,
    client,
    connector,
    delivered,
    execute,
    mia,
    post,
    signing_keys,
    teams,
    teams_activity,
)

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "clarion.ops.cli"]

__all__ = ["ana", "client", "connector", "fake", "mia", "slack_env", "teams"]  # fixtures


@pytest.fixture
def slack_client(slack_env) -> Iterator[TestClient]:
    with TestClient(create_app()) as test_client:
        yield test_client


def slack_post(client: TestClient, body: bytes, headers: dict[str, Any]) -> Any:
    return client.post("/slack/events", content=body, headers=headers)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info
    ]


# --- Slack ------------------------------------------------------------------------------------------------


def test_slack_refuses_an_oversized_body_before_reading_its_signature(slack_client, caplog):
    big = b"payload=" + b"x" * (64 * 1024)
    response = slack_post(slack_client, big, signed(SECRET, big, content_type=FORM))
    assert (response.status_code, response.json()) == (413, {"error": "body over 65536 bytes"})

    def chunks() -> Iterator[bytes]:  # no Content-Length: the stream is cut off at the limit
        for _ in range(100):
            yield b"x" * 1024

    response = slack_client.post("/slack/events", content=chunks(), headers={"Content-Type": FORM})
    assert response.status_code == 413
    assert slack_post(slack_client, b"{}", {"Content-Length": "lots"}).status_code == 400
    assert errors(caplog) == []


UNSIGNED_HEADERS = [
    {},
    {"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=abc"},
    {"X-Slack-Request-Timestamp": "9" * 4000, "X-Slack-Signature": "v0=" + "0" * 64},
    {"X-Slack-Request-Timestamp": "١٧٠٠٠٠٠٠٠٠".encode(), "X-Slack-Signature": b"v0=\xff"},
    {"X-Slack-Request-Timestamp": "", "X-Slack-Signature": ""},
]


def test_unsigned_bodies_that_do_not_parse_get_401_not_500(slack_client, caplog):
    for headers in UNSIGNED_HEADERS:
        for body in (b"\xff\xfe\x00garbage", b"payload=%7B%22type", b"[" * 10_000, b""):
            response = slack_post(
                slack_client, body, {"Content-Type": "application/json", **headers}
            )
            assert response.status_code == 401
            assert len(response.content) < 100 and "error" in response.json()
    assert errors(caplog) == []


def test_signed_bodies_that_are_not_utf8_json_or_form_get_400(slack_client, caplog):
    for body, content_type in [
        (b"\xff\xfe\x00garbage", FORM),
        (b"{not json", "application/json"),
        (b"[" * 10_000, "application/json"),
        (b"payload=%7B%22type", FORM),
        (b"payload=" + b"%5B" * 3000, FORM),
        (b"payload=%ff%fe", FORM),
    ]:
        response = slack_post(slack_client, body, signed(SECRET, body, content_type=content_type))
        assert response.status_code == 400, body[:20]
    assert errors(caplog) == []


def _payload(**changes: Any) -> bytes:
    """A signed-to-be click (by U1, on a delivery that does not exist) with fields replaced."""
    body = block_actions("U1", '{"u":"ana","d":1,"a":"quality"}', action_id="clarion:quality")
    payload = {**json.loads(dict(parse_qsl(body.decode()))["payload"]), **changes}
    return urlencode({"payload": json.dumps(payload)}).encode()


WRONG_SHAPES = [
    {"actions": {"0": {"action_id": "clarion:quality"}}},
    {"actions": [{"action_id": 5, "value": "x"}]},
    {"actions": ["clarion:quality"]},
    {"user": "U1"},
    {"user": {"id": {"id": "U1"}}},
    {"container": ["D0"], "channel": None},
    {"team": ["T1"]},
    {"actions": [{"action_id": "clarion:quality", "value": {"k": "\x00"}}]},
]


def test_signed_clicks_of_the_wrong_shape_get_400_and_change_nothing(
    ana, fake, slack_client, caplog
):
    for changes in WRONG_SHAPES:
        body = _payload(**changes)
        assert (
            slack_post(slack_client, body, signed(SECRET, body, content_type=FORM)).status_code
            == 400
        ), changes
    assert count("interactions") == 0 and fake.called("chat.postEphemeral") == []
    assert errors(caplog) == []


def test_signed_well_formed_values_of_any_type_are_recorded_rejections(
    ana, fake, slack_client, caplog
):
    for value in ({"u": "ana"}, ["x"], 12, None, "not json"):
        body = _payload(
            actions=[{"action_id": "clarion:quality", "value": value, "type": "button"}]
        )
        assert (
            slack_post(slack_client, body, signed(SECRET, body, content_type=FORM)).status_code
            == 200
        )
    assert (
        rows("SELECT outcome, reason FROM interactions")
        == [{"outcome": "rejected", "reason": "malformed"}] * 5
    )
    assert errors(caplog) == []


def test_ssl_check_and_unhandled_kinds_are_answered_without_bolt(slack_client):
    for body, status in ((b"ssl_check=1&token=x", 200), (b"command=%2Fx&text=y", 404)):
        assert (
            slack_post(slack_client, body, signed(SECRET, body, content_type=FORM)).status_code
            == status
        )


# --- Teams: the door ------------------------------------------------------------------------------


def test_teams_refuses_an_oversized_body(teams, client, connector):
    activity = teams_activity("message", connector, text="x" * (300 * 1024))
    assert post(client, activity).status_code == 413


def test_an_invoke_whose_value_is_not_a_card_action_gets_400_not_500(
    mia, client, connector, caplog
):
    for value in (
        "x",
        [1],
        {"action": "x"},
        {"action": {"verb": 1}},
        {"action": {"verb": "clarion", "data": 5}},
    ):
        response = post(
            client, teams_activity("invoke", connector, name="adaptiveCard/action", value=value)
        )
        assert response.status_code == 400 and "value" in response.json()["error"]
    assert count("interactions") == 0 and errors(caplog) == []


def test_activities_of_the_wrong_shape_get_400_and_change_nothing(mia, client, connector, caplog):
    before = rows("SELECT addresses FROM recipients")
    for changes in (
        {"from": "29:x"},
        {"channelData": {"tenant": "t"}},
        {"serviceUrl": 5},
        {"serviceUrl": "http://[::1"},
        {"conversation": []},
        {"text": ["hi"]},
    ):
        response = post(client, {**teams_activity("message", connector, text="hi"), **changes})
        assert response.status_code == 400, changes
    assert rows("SELECT addresses FROM recipients") == before and errors(caplog) == []


def test_outside_local_mode_an_unauthenticated_body_is_401_whatever_it_holds(
    teams, connector, monkeypatch
):
    configure(monkeypatch, teams_app_id="11111111-app", teams_app_password="secret")
    with TestClient(create_app()) as client:
        for token in (None, "not-a-jwt", "a.b", "a.b.c"):
            headers = {
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            }
            for body in (
                b"\xff not json",
                b"[1]",
                json.dumps({"type": "invoke", "value": "x"}).encode(),
            ):
                response = client.post("/api/messages", content=body, headers=headers)
                assert response.status_code == 401, (token, body)


def test_a_help_reply_the_connector_refuses_is_not_an_error(teams, client, connector, caplog):
    connector.fail_next(403)
    response = post(client, teams_activity("message", connector, text="hello", user="29:someone"))
    assert response.status_code == 201
    assert [c.status for c in connector.calls] == [403]
    assert errors(caplog) == []
    assert "teams_reply_failed" in [getattr(r, "action", None) for r in caplog.records]


# --- Teams: content is text ---------------------------------------------------------------------------

LINK_VARIABLE = "[Reset your password](https://evil.example)"
IMAGE_VARIABLE = "![x](https://evil.example/a.png)"
COMMONMARK = MarkdownIt("commonmark")
UNESCAPED_LINK = re.compile(r"(?<!\\)\]\(")  # "](" with the bracket not escaped: a link or an image


def _text_blocks(card: dict) -> list[str]:
    return [b["text"] for b in card["body"] if b["type"] == "TextBlock"]


def test_a_variable_carrying_a_markdown_link_and_image_shows_on_the_card_as_text(
    mia, client, connector
):
    key = delivered(variables={"first_name": LINK_VARIABLE, "plan_name": IMAGE_VARIABLE})
    card = connector.sent[0].card
    answered = post(client, execute(ButtonValue(MIA, key[1], "start").encode(), connector)).json()[
        "value"
    ]
    for shown in (card, answered):
        texts = _text_blocks(shown)
        assert len(texts) >= 2
        for text in texts:
            assert not UNESCAPED_LINK.search(text), text
            html = COMMONMARK.render(text)
            assert "<a " not in html and "<img" not in html, html
        visible = [COMMONMARK.render(t) for t in texts]
        assert any(LINK_VARIABLE in v for v in visible) and any(
            IMAGE_VARIABLE in v for v in visible
        )
    assert _text_blocks(card)[0] == r"Welcome to !\[x\]\(https://evil.example/a.png)"
    assert connector.sent[0].payload["summary"]  # the preview keeps the title, as plain text


# --- Teams local mode: the stored conversation ----------------------------------------------------------


def _stored() -> dict[str, Any]:
    return json.loads(
        rows("SELECT addresses FROM recipients WHERE user_id = :u", u=MIA)[0]["addresses"][
            "teams_conversation"
        ]
    )


def test_in_local_mode_the_first_conversation_is_stored_from_any_origin(teams, client):
    register_recipient(MIA, timezone="UTC", addresses={"teams": MIA_TEAMS})
    with FakeConnector() as somewhere:
        assert post(client, teams_activity("message", somewhere, text="hi")).status_code == 201
        assert _stored()["serviceUrl"] == somewhere.url


def test_in_local_mode_a_forged_activity_from_another_origin_keeps_her_conversation(
    mia, client, connector, caplog
):
    before = _stored()
    with FakeConnector() as attacker:  # another port on this host: another origin
        forged = teams_activity("message", attacker, text="hi", conversation="a:attackers-chat")
        assert post(client, forged).status_code == 201
        assert _stored() == before
        assert "teams_reference_refused" in [getattr(r, "action", None) for r in caplog.records]
        delivered()  # her next nudge goes where it always went
        assert attacker.sent == [] and len(connector.sent) == 1


def test_in_local_mode_the_same_origin_may_move_her_conversation(mia, client, connector):
    assert (
        post(
            client, teams_activity("message", connector, text="hi", conversation="a:new-chat")
        ).status_code
        == 201
    )
    assert _stored()["conversationId"] == "a:new-chat"


def test_a_refused_activity_does_not_lift_a_deactivation(mia, client, connector):
    connector.remove_bot(CONVERSATION)
    request = notify(
        MIA, "plan_kickoff", event_id="gone", variables={"first_name": "Mia", "plan_name": "P"}
    )
    route([MIA], [request.request_id])
    drain("activation")
    [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request.request_id)
    assert deliver([row["user_id"]], [row["id"]]) == 0
    assert count("suppressions") == 1
    with FakeConnector() as attacker:
        post(
            client,
            teams_activity("message", attacker, text="hi again", conversation="a:attackers-chat"),
        )
    assert count("suppressions") == 1
    post(client, teams_activity("message", connector, text="hi again"))  # her own chat: back on
    assert count("suppressions") == 0


def test_an_authenticated_activity_may_replace_the_conversation(mia, connector, monkeypatch):
    configure(monkeypatch, teams_app_id="11111111-app", teams_app_password="secret")
    private, jwks = signing_keys()
    adapter = web_teams.build_adapter(openid_metadata_url=connector.serve_keys(jwks))
    with (
        FakeConnector() as elsewhere,
        TestClient(Starlette(routes=web_teams.routes(adapter=adapter))) as client,
    ):
        token = jwt.encode(
            {
                "iss": "https://api.botframework.com",
                "aud": "11111111-app",
                "serviceurl": elsewhere.url,
                "exp": int(time.time()) + 300,
                "nbf": int(time.time()) - 10,
            },
            private,
            algorithm="RS256",
            headers={"kid": "k1"},
        )
        moved = teams_activity("message", elsewhere, text="hi", conversation="a:moved")
        assert post(client, moved, token).status_code == 201
    assert (_stored()["serviceUrl"], _stored()["conversationId"]) == (elsewhere.url, "a:moved")


# --- clarion web in local mode ------------------------------------------------------------------------


def _cli_env(clarion_env, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    return {**env, **clarion_env.env, "PYTHONPATH": str(ROOT), **extra}


def test_clarion_web_refuses_a_public_host_in_local_mode(clarion_env):
    done = subprocess.run(
        [*CLI, "web", "--host", "0.0.0.0", "--port", "0"],
        env=_cli_env(clarion_env, CLARION_TEAMS_APP_ID="none"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "refusing to serve Teams without authentication on '0.0.0.0'" in done.stderr
    assert "WARNING" not in done.stdout


def test_clarion_web_warns_at_start_in_local_mode(clarion_env):
    process = subprocess.Popen(
        [*CLI, "web", "--host", "127.0.0.1", "--port", "0"],
        cwd=ROOT,
        env=_cli_env(clarion_env, CLARION_TEAMS_APP_ID="none"),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        first = process.stderr.readline() if process.stderr else ""
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert first.startswith(
        "clarion: WARNING: CLARION_TEAMS_APP_ID=none: Teams requests are NOT authenticated"
    )


def test_clarion_web_binds_a_public_host_in_local_mode_only_when_told(clarion_env):
    process = subprocess.Popen(
        [*CLI, "web", "--host", "0.0.0.0", "--port", "0", "--allow-insecure-teams"],
        cwd=ROOT,
        env=_cli_env(clarion_env, CLARION_TEAMS_APP_ID="none"),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = [process.stderr.readline() for _ in range(2)] if process.stderr else []
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert lines[0].startswith("clarion: WARNING:")
    assert "refusing" not in "".join(lines)


# --- the app served by a process ------------------------------------------------------------------

SERVERS = {
    "uvicorn web.app:app": [sys.executable, "-m", "uvicorn", "clarion.web.app:app", "--port", "0"],
    "clarion web": [*CLI, "web", "--port", "0"],
}


@pytest.mark.parametrize("command", SERVERS.values(), ids=SERVERS.keys())
def test_the_app_serves_as_a_process_on_the_configured_database(clarion_env, command):
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=_cli_env(clarion_env),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        said = []
        for line in process.stderr or ():  # uvicorn logs to stderr; EOF if the process died
            said.append(line)
            if found := re.search(r"Uvicorn running on (http://\S+)", line):
                break
        assert found, "".join(said)
        url = found[1]
        assert httpx.get(f"{url}/healthz", timeout=30).json() == {"status": "ok"}
        # the key is looked up in the fixture's database (an unmigrated one would be a 503)
        unknown = {"Authorization": f"Bearer clk_{'0' * 12}_{'A' * 43}"}
        answer = httpx.post(f"{url}/v1/events", json={}, headers=unknown, timeout=30)
        assert answer.status_code == 401, answer.text
    finally:
        process.terminate()
        process.wait(timeout=30)
