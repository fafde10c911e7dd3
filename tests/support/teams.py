"""The Teams channel's test world, shared by tests/integration/test_teams.py and the door tests
(test_doors.py, test_door_fuzz.py): the local Bot Connector (`connector`), the activation catalog
with Teams in local mode (`teams`), the app's door (`client`), the recipient `mia` who has greeted
the bot, activities as Teams posts them, and a delivery routed and sent.

A module that uses the fixtures imports them and lists them in `__all__`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from starlette.testclient import TestClient

from clarion.records import ButtonValue
from clarion.standins.fake_connector import FakeConnector
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.web import teams as web_teams
from clarion.web.app import create_app
from tests.support.environment import ACTIVATION
from tests.support.pipeline import configure, drain, publishing_to_this_tests_broker, rows

MIA = "mia"


MIA_TEAMS = "29:1mia-aad"


CONVERSATION = "a:1mia-personal-chat"


EVE_TEAMS = "29:1eve-aad"


BOT = "28:clarion-bot"


KICKOFF = {"first_name": "Mia", "plan_name": "Grow 2026"}


Key = tuple[str, int]


@pytest.fixture
def connector() -> Iterator[FakeConnector]:
    with FakeConnector() as server:
        yield server


@pytest.fixture
def teams(clarion_env, monkeypatch) -> Iterator[None]:
    """The activation catalog and the Teams channel in local mode (no Bot Framework auth)."""
    configure(monkeypatch, catalog=ACTIVATION, teams_app_id="none")
    with publishing_to_this_tests_broker():
        yield


@pytest.fixture
def client(teams) -> Iterator[TestClient]:
    with TestClient(create_app()) as test_client:
        yield test_client


def teams_activity(
    kind: str,
    connector: FakeConnector,
    *,
    user: str = MIA_TEAMS,
    conversation: str = CONVERSATION,
    scope: str = "personal",
    **fields: Any,
) -> dict[str, Any]:
    """An activity as Teams POSTs it to a bot."""
    return {
        "type": kind,
        "id": f"f:{uuid.uuid4().hex[:12]}",
        "channelId": "msteams",
        "serviceUrl": connector.url,
        "timestamp": "2026-03-02T09:00:00.000Z",
        "from": {"id": user, "name": "Someone", "aadObjectId": "00000000-aaaa"},
        "recipient": {"id": BOT, "name": "clarion"},
        "conversation": {"id": conversation, "conversationType": scope, "tenantId": "tenant-1"},
        "channelData": {"tenant": {"id": "tenant-1"}},
        **fields,
    }


def invoke(
    data: Any,
    connector: FakeConnector,
    *,
    verb: str = "clarion",
    reply_to: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """What Teams sends for an Action.Execute press: an adaptiveCard/action invoke."""
    return teams_activity(
        "invoke",
        connector,
        name="adaptiveCard/action",
        replyToId=reply_to,
        value={
            "action": {"type": "Action.Execute", "id": "a1", "verb": verb, "data": data},
            "trigger": "manual",
        },
        **kw,
    )


def execute(value: Any, connector: FakeConnector, **kw: Any) -> dict[str, Any]:
    """A clarion button pressed through Action.Execute."""
    return invoke({"clarion": value}, connector, **kw)


def post(client: TestClient, activity: dict[str, Any], token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post("/api/messages", json=activity, headers=headers)


@pytest.fixture
def mia(teams, client, connector) -> str:
    """A recipient with only a Teams address, who has said hello to the bot (so it may write to her)."""
    register_recipient(MIA, timezone="Europe/Berlin", addresses={"teams": MIA_TEAMS})
    assert post(client, teams_activity("message", connector, text="hi")).status_code == 201
    assert [c.payload.get("text") for c in connector.replies] == [web_teams.HELP]
    return MIA


def nudge(
    user: str = MIA,
    type_key: str = "plan_kickoff",
    event: str = "k1",
    variables: dict | None = None,
) -> Key:
    """Notify and route one request; the key of its Teams delivery."""
    request = notify(
        user, type_key, event_id=event, variables=KICKOFF if variables is None else variables
    )
    assert route([user], [request.request_id]) == 1
    [row] = rows(
        "SELECT user_id, id, channel FROM deliveries WHERE request_id = :r", r=request.request_id
    )
    assert row["channel"] == "teams"
    drain("activation")
    return row["user_id"], row["id"]


def delivered(user: str = MIA, **kw: Any) -> Key:
    """Notify and route one request, which the route sends itself; the key of its delivery."""
    key = nudge(user, **kw)
    row = delivery(key)
    assert (row["state"], row["attempts"]) == ("sent", 1)
    assert deliver([key[0]], [key[1]]) == 0  # nothing left for a deliver task to claim
    return key


def delivery(key: Key) -> dict[str, Any]:
    [row] = rows(
        "SELECT state, platform, provider_message_id, answer, answered_by, last_error, attempts,"
        " not_before FROM deliveries WHERE user_id = :u AND id = :i",
        u=key[0],
        i=key[1],
    )
    return row


def value(key: Key, answer: str) -> str:
    return ButtonValue(key[0], key[1], answer).encode()


def signing_keys() -> tuple[Any, dict[str, Any]]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
    return private, {"keys": [{**jwk, "kid": "k1", "use": "sig", "endorsements": ["msteams"]}]}
