"""The Slack channel's test world, shared by tests/integration/test_slack.py and the door tests
(test_doors.py, test_door_fuzz.py): the local Slack (`fake`), the activation catalog pointed at it
(`slack_env`), the recipient `ana`, and a nudge routed and read back from the ledger.

A module that uses the fixtures imports them and lists them in `__all__`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from clarion.standins.fake_slack import FakeSlack
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.environment import ACTIVATION
from tests.support.pipeline import configure, drain, publishing_to_this_tests_broker, rows

SECRET = "clarion-signing-secret"


FORM = "application/x-www-form-urlencoded"


Key = tuple[str, int]


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        yield server


@pytest.fixture
def slack_env(clarion_env, fake, monkeypatch) -> Iterator[None]:
    """The activation catalog, with the Slack channel pointed at the local Slack (the tables of
    pure cases below need none of it)."""
    configure(
        monkeypatch,
        catalog=ACTIVATION,
        slack_token=FakeSlack.TOKEN,
        slack_api_url=fake.api_url,
        slack_signing_secret=SECRET,
    )
    with publishing_to_this_tests_broker():
        yield


@pytest.fixture
def ana(slack_env) -> str:
    register_recipient("ana", timezone="Europe/Berlin", addresses={"slack": "U1"})
    return "ana"


def slack_nudge(
    user: str, type_key: str = "goal_prompt", event: str = "e1", **variables: str
) -> Key | None:
    """Notify and route one nudge; the key of its Slack delivery, or None if it got none."""
    request = notify(user, type_key, event_id=event, variables={"first_name": "Ana", **variables})
    assert route([user], [request.request_id]) == 1
    drain("activation")
    found = rows(
        "SELECT user_id, id FROM deliveries WHERE request_id = :r AND channel = 'slack'",
        r=request.request_id,
    )
    return (found[0]["user_id"], found[0]["id"]) if found else None


def deliver_keys(*keys: Key) -> int:
    return deliver([k[0] for k in keys], [k[1] for k in keys])


def slack_delivery(key: Key) -> dict:
    [row] = rows(
        "SELECT state, platform, attempts, provider_message_id, last_error, not_before, answer,"
        " answered_by, maybe_sent_at FROM deliveries WHERE user_id = :u AND id = :i",
        u=key[0],
        i=key[1],
    )
    return row


def click_value(key: Key, answer: str) -> str:
    return json.dumps({"u": key[0], "d": key[1], "a": answer}, separators=(",", ":"))
