"""Fuzz through the real doors: arbitrary bytes, headers and JSON shapes POSTed to /slack/events and
/api/messages of clarion's HTTP app (Starlette's TestClient on web.app), signed with the right
secret or token (so the body reaches Bolt, botbuilder and clarion's handlers) and unsigned.

Whatever comes in: no 5xx, no ERROR log record and no traceback, and no state change but recorded
rejections: deliveries, answers, preferences, recipients (their stored conversations too) and
suppressions stay as they were, and every interaction row is a rejection. The generated shapes
stay near the real envelopes so that most signed requests get past the shape checks; the run
asserts that signed ones reached the handlers (200s and recorded rejections), not only refusals.

Real PostgreSQL and Redis, the local Slack Web API and Bot Framework connector. Deterministic
(derandomize=True); about 40 s in all.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.testclient import TestClient

from clarion.standins.fake_slack import sign
from clarion.web import teams as web_teams
from clarion.web.app import create_app
from tests.support.pipeline import configure, count, rows
from tests.support.slack import (
    FORM,
    SECRET,
    ana,
    click_value,
    deliver_keys,
    fake,
    slack_delivery,
    slack_env,
    slack_nudge,
)
from tests.support.teams import (
    CONVERSATION,
    EVE_TEAMS,
    client,
    connector,
    delivered,
    mia,
    signing_keys,
    teams,
    value,
)

pytestmark = pytest.mark.integration

__all__ = ["ana", "client", "connector", "fake", "mia", "slack_env", "teams"]  # fixtures

FUZZ = settings(
    max_examples=160,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
APP_ID = "11111111-app"

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**20)
    | st.floats()
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40
).map(lambda t: t.encode("latin-1"))


def state() -> dict[str, Any]:
    """Everything a request to a door could change, but for recorded rejections."""
    return {
        "deliveries": rows(
            "SELECT user_id, id, state, answer, answered_at, answered_by, updated_at"
            " FROM deliveries ORDER BY id"
        ),
        "preferences": rows("SELECT * FROM preferences ORDER BY 1"),
        "recipients": rows(
            "SELECT user_id, addresses, updated_at FROM recipients ORDER BY user_id"
        ),
        "suppressions": count("suppressions"),
        "requests": count("requests"),
    }


def assert_only_rejections(before: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    assert state() == before
    assert count("interactions") == count("interactions", "outcome = 'rejected'")
    bad = [
        (r.name, r.getMessage())
        for r in caplog.records
        if r.levelname in ("ERROR", "CRITICAL") or r.exc_info
    ]
    assert bad == []


# --- Slack ---------------------------------------------------------------------------------------------


def usually(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape (so that requests get past the checks), sometimes anything at all."""
    return st.sampled_from([True, True, True, False]).flatmap(
        lambda shaped: right if shaped else JSON
    )


def slack_payloads(real_values: list[str]) -> st.SearchStrategy[Any]:
    """Interactivity and Events API payloads, each field the right type or anything at all."""
    ids = usually(st.sampled_from(["U2", "U9", "W0X", "DU1", "T0CLARION"]))  # never U1: ana's own
    action = st.fixed_dictionaries(
        {
            "action_id": usually(
                st.sampled_from(
                    [
                        "clarion:quality",
                        "clarion:grow_team",
                        "clarion_pref:stalled_plan",
                        "clarion_pref:nope",
                        "host_button",
                    ]
                )
            )
        },
        optional={
            "value": st.sampled_from([*real_values, "on", "off"]) | JSON,
            "block_id": usually(st.just("clarion_answers")),
            "type": usually(st.just("button")),
        },
    )
    block_actions = st.fixed_dictionaries(
        {
            "type": st.just("block_actions"),
            "user": usually(st.fixed_dictionaries({"id": ids}, optional={"team_id": ids})),
            "actions": usually(st.lists(usually(action), min_size=1, max_size=3)),
        },
        optional={
            "container": usually(
                st.fixed_dictionaries({}, optional={"channel_id": ids, "message_ts": ids})
            ),
            "channel": usually(st.fixed_dictionaries({}, optional={"id": ids})),
            "team": usually(st.fixed_dictionaries({}, optional={"id": ids})),
            "api_app_id": ids,
        },
    )
    event = st.fixed_dictionaries(
        {"type": usually(st.sampled_from(["app_home_opened", "message"]))},
        optional={
            "user": ids,
            "tab": usually(st.sampled_from(["home", "messages"])),
            "channel": ids,
        },
    )
    callback = st.fixed_dictionaries(
        {"type": st.just("event_callback"), "event": usually(event)},
        optional={"team_id": ids, "event_id": ids},
    )
    verification = st.fixed_dictionaries(
        {"type": st.just("url_verification")}, optional={"challenge": usually(st.text(max_size=20))}
    )
    return st.one_of(block_actions, block_actions, callback, verification, JSON)


CONTENT_TYPES = st.sampled_from(["application/json", FORM, "text/plain", ""])


def slack_bodies(real_values: list[str]) -> st.SearchStrategy[tuple[bytes, str]]:
    """(body, content type): mostly the type Slack would send with it, sometimes any."""
    payloads = slack_payloads(real_values)

    def typed(
        bodies: st.SearchStrategy[bytes], content_type: str
    ) -> st.SearchStrategy[tuple[bytes, str]]:
        return st.tuples(
            bodies, st.one_of(st.just(content_type), st.just(content_type), CONTENT_TYPES)
        )

    form = payloads.map(lambda p: urlencode({"payload": json.dumps(p)}).encode())
    return st.one_of(
        typed(payloads.map(lambda p: json.dumps(p).encode()), "application/json"),
        typed(form, FORM),
        typed(form, FORM),
        typed(
            st.dictionaries(
                st.sampled_from(["payload", "ssl_check", "command", "x"]),
                st.text(max_size=20),
                max_size=3,
            ).map(lambda f: urlencode(f).encode()),
            FORM,
        ),
        st.tuples(
            st.binary(max_size=200)
            | st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
            CONTENT_TYPES,
        ),
    )


@st.composite
def slack_requests(draw: st.DrawFn, real_values: list[str]) -> tuple[bytes, dict[str, Any], str]:
    """(body, headers, how it was signed)."""
    body, content_type = draw(slack_bodies(real_values))
    how = draw(
        st.sampled_from(
            ["signed", "signed", "signed", "unsigned", "other_secret", "stale", "garbage"]
        )
    )
    ts = str(int(time.time()) - (400 if how == "stale" else 0))
    headers: dict[str, Any] = {"Content-Type": content_type}
    if how in ("signed", "stale", "other_secret"):
        headers |= {
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sign(SECRET if how != "other_secret" else "nope", ts, body),
        }
    elif how == "garbage":
        headers |= {
            "X-Slack-Request-Timestamp": draw(HEADER_TEXT),
            "X-Slack-Signature": draw(HEADER_TEXT),
        }
    return body, headers, how


def test_fuzzed_requests_to_the_slack_endpoint(ana, fake, caplog):
    key = slack_nudge(ana)
    assert key is not None
    sent = slack_delivery(key)
    assert (sent["state"], sent["attempts"]) == ("sent", 1)  # the route sent it itself
    assert deliver_keys(key) == 0  # nothing left for a deliver task
    real = [click_value(key, a) for a in ("grow_team", "ship_faster", "quality")]
    before, seen = state(), Counter()

    with TestClient(create_app()) as client:

        @settings(FUZZ, max_examples=600)
        @given(slack_requests(real))
        def post(request: tuple[bytes, dict[str, Any], str]) -> None:
            body, headers, how = request
            response = client.post("/slack/events", content=body, headers=headers)
            assert response.status_code < 500, (response.status_code, body[:200], headers)
            assert how == "signed" or response.status_code == 401
            seen[(how == "signed", response.status_code)] += 1

        post()
    assert_only_rejections(before, caplog)
    assert seen[(True, 200)] >= 20 and seen[(True, 400)] >= 20 and seen[(False, 401)] >= 20, seen
    assert count("interactions") >= 5  # signed clicks reached handle_click and were recorded


# --- Teams ---------------------------------------------------------------------------------------------


def teams_activities(service_url: str, real_values: list[str]) -> st.SearchStrategy[Any]:
    """Activities as Teams POSTs them, each field the right type or anything at all; never from mia
    (in local mode anything she sends is trusted, so her own clicks would count)."""
    ids = usually(st.sampled_from([EVE_TEAMS, "29:1stranger", "a:1x"]))
    card_data = st.fixed_dictionaries(
        {},
        optional={
            "clarion": st.sampled_from(real_values) | JSON,
            "clarion_preferences": usually(st.sampled_from(["open", "save"])),
            "type:stalled_plan": usually(st.sampled_from(["true", "false"])),
        },
    )
    card_action = st.fixed_dictionaries(
        {
            "action": usually(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "verb": usually(
                            st.sampled_from(["clarion", "clarion_preferences", "host"])
                        ),
                        "data": usually(card_data),
                        "type": usually(st.just("Action.Execute")),
                    },
                )
            )
        }
    )
    common = st.fixed_dictionaries(
        {
            "serviceUrl": usually(
                st.sampled_from([service_url] * 6 + ["ftp://x/", "http://[::1", "not a url"])
            ),
            "from": usually(
                st.fixed_dictionaries({"id": ids}, optional={"name": usually(st.text(max_size=10))})
            ),
            "conversation": usually(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "id": usually(st.sampled_from([CONVERSATION, "a:eve"])),
                        "conversationType": usually(st.sampled_from(["personal", "groupChat"])),
                        "tenantId": ids,
                    },
                )
            ),
        },
        optional={
            "id": ids,
            "channelId": usually(st.just("msteams")),
            "replyToId": ids,
            "recipient": usually(st.fixed_dictionaries({}, optional={"id": ids})),
            "channelData": usually(st.just({"tenant": {"id": "tenant-1"}})),
        },
    )
    click_data = st.fixed_dictionaries({"clarion": st.sampled_from(real_values) | JSON})
    execute = st.fixed_dictionaries(
        {
            "type": st.just("invoke"),
            "name": st.just("adaptiveCard/action"),
            "value": usually(
                st.fixed_dictionaries(
                    {
                        "action": st.fixed_dictionaries(
                            {"verb": usually(st.just("clarion")), "data": usually(click_data)}
                        )
                    }
                )
            ),
        }
    )
    submit = st.fixed_dictionaries({"type": st.just("message"), "value": usually(click_data)})
    other = st.fixed_dictionaries(
        {"type": usually(st.sampled_from(["message", "invoke", "conversationUpdate"]))},
        optional={
            "name": usually(st.sampled_from(["adaptiveCard/action", "composeExtension/query"])),
            "text": usually(st.sampled_from(["preferences", "hi", "<at>clarion</at> preferences"])),
            "value": st.one_of(card_action, card_data, JSON),
        },
    )
    activity = st.tuples(common, st.one_of(execute, submit, other, other)).map(
        lambda p: {**p[0], **p[1]}
    )
    return usually(activity)


@st.composite
def teams_requests(
    draw: st.DrawFn, service_url: str, real_values: list[str], signer: Any, local: bool
) -> tuple[bytes, dict[str, Any], str]:
    """(body, headers, how it was authenticated): a valid channel token, none, or a bad one (in
    local mode mostly none: there botbuilder refuses every token, having no app id to check for)."""
    activity = draw(teams_activities(service_url, real_values))
    body = draw(st.one_of(*[st.just(json.dumps(activity).encode())] * 6, st.binary(max_size=120)))
    headers: dict[str, Any] = {
        "Content-Type": draw(st.sampled_from(["application/json"] * 4 + ["text/plain"]))
    }
    how = draw(
        st.sampled_from(
            ["none"] * 6 + ["garbage", "token"]
            if local
            else ["token", "token", "none", "garbage", "other_key"]
        )
    )
    fields = activity if isinstance(activity, dict) else {}
    claimed = fields.get("serviceUrl") if isinstance(fields.get("serviceUrl"), str) else service_url
    if how in ("token", "other_key"):
        headers["Authorization"] = "Bearer " + signer(how == "other_key", claimed)
    elif how == "garbage":
        headers["Authorization"] = b"x" + draw(
            HEADER_TEXT
        )  # any octets (an empty header is no header)
    return body, headers, how


@pytest.fixture
def signer() -> Any:
    private, jwks = signing_keys()
    other, _ = signing_keys()

    def sign_token(wrong_key: bool, service_url: str) -> str:
        claims = {
            "iss": "https://api.botframework.com",
            "aud": APP_ID,
            "serviceurl": service_url,
            "exp": int(time.time()) + 300,
            "nbf": int(time.time()) - 10,
        }
        return jwt.encode(
            claims, other if wrong_key else private, algorithm="RS256", headers={"kid": "k1"}
        )

    sign_token.jwks = jwks  # type: ignore[attr-defined]
    return sign_token


@pytest.fixture(params=["authenticated", "local"])
def teams_door(request, mia, connector, signer, monkeypatch) -> Iterator[tuple[TestClient, str]]:
    """clarion's /api/messages with Bot Framework authentication (keys served by the local
    connector), or in local mode (no authentication: everything reaches the handlers)."""
    if request.param == "authenticated":
        configure(monkeypatch, teams_app_id=APP_ID, teams_app_password="secret")
        adapter = web_teams.build_adapter(openid_metadata_url=connector.serve_keys(signer.jwks))
        app = Starlette(routes=web_teams.routes(adapter=adapter))
    else:
        app = create_app()
    with TestClient(app) as client:
        yield client, request.param


def test_fuzzed_requests_to_the_teams_endpoint(teams_door, connector, signer, caplog):
    client, mode = teams_door
    key = delivered() if mode == "local" else None
    real = [value(key, a) for a in ("start", "later")] if key else ['{"u":"mia","d":1,"a":"start"}']
    before, seen = state(), Counter()

    @settings(FUZZ, max_examples=250)
    @given(teams_requests(connector.url, real, signer, mode == "local"))
    def post(request: tuple[bytes, dict[str, Any], str]) -> None:
        body, headers, how = request
        response = client.post("/api/messages", content=body, headers=headers)
        assert response.status_code < 500, (response.status_code, body[:300], headers)
        reached = how == "token" if mode == "authenticated" else how == "none"
        assert reached or response.status_code in (401, 415), (how, response.status_code)
        seen[(reached, response.status_code)] += 1

    post()
    assert_only_rejections(before, caplog)
    assert sum(n for (reached, status), n in seen.items() if reached and status < 400) >= 20, seen
    assert sum(n for (reached, status), n in seen.items() if reached and status == 400) >= 10, seen
    if (
        mode == "local"
    ):  # clicks on her real buttons, by others, reached handle_click and were recorded
        assert count("interactions", "reason = 'foreign_user'") >= 3
