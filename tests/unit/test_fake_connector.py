"""The local Bot Framework connector (standins/fake_connector.py) answers the real
botframework-connector SDK as Teams' connector does: ids for new activities, replacement of known
ones, 404 for an activity it never issued, 403 BotNotInConversationRoster after an uninstall,
scripted failures with Retry-After, and answers lost after the call was taken."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from botbuilder.schema import Activity
from botframework.connector import ConnectorClient
from botframework.connector.auth import MicrosoftAppCredentials
from botframework.connector.models import ErrorResponseException

from clarion.standins.fake_connector import FakeConnector

CONVERSATION = "a:1Xk9"


@pytest.fixture
def fake() -> Iterator[FakeConnector]:
    with FakeConnector() as running:
        yield running


def client(fake: FakeConnector) -> ConnectorClient:
    return ConnectorClient(MicrosoftAppCredentials.empty(), base_url=fake.url)


def message(text: str) -> Activity:
    return Activity(type="message", text=text)


def test_a_new_message_gets_an_id_and_its_update_replaces_it(fake):
    sdk = client(fake)
    sent = sdk.conversations.send_to_conversation(CONVERSATION, message("first"))
    assert sent.id.startswith("1:")
    updated = sdk.conversations.update_activity(CONVERSATION, sent.id, message("second"))
    assert updated.id == sent.id
    assert [c.payload["text"] for c in fake.sent] == ["first"]
    assert [(c.activity_id, c.payload["text"]) for c in fake.updates] == [(sent.id, "second")]


def test_an_update_of_an_activity_it_never_issued_is_404(fake):
    with pytest.raises(
        ErrorResponseException, match=r"^\(ActivityNotFound\) no such activity$"
    ) as refused:
        client(fake).conversations.update_activity(CONVERSATION, "1:404", message("x"))
    assert refused.value.response.status_code == 404
    assert fake.updates == []


def test_after_an_uninstall_every_call_is_403_not_in_roster(fake):
    fake.remove_bot(CONVERSATION)
    with pytest.raises(
        ErrorResponseException, match=r"^\(BotNotInConversationRoster\) "
    ) as refused:
        client(fake).conversations.send_to_conversation(CONVERSATION, message("x"))
    assert refused.value.response.status_code == 403
    assert refused.value.error.error.code == "BotNotInConversationRoster"
    assert fake.sent == []


def test_scripted_failures_answer_in_order_with_retry_after_then_normally(fake):
    fake.fail_next(429, retry_after=30)
    url = f"{fake.url}v3/conversations/{CONVERSATION}/activities"
    first = requests.post(url, json={"type": "message", "text": "x"}, timeout=5)
    assert (first.status_code, first.headers["Retry-After"]) == (429, "30")
    second = requests.post(url, json={"type": "message", "text": "x"}, timeout=5)
    assert second.status_code == 201 and second.json()["id"].startswith("1:")
    assert [c.status for c in fake.calls] == [429, 201]


def test_a_lost_answer_was_still_taken(fake):
    fake.losses.next("drop")
    with pytest.raises(
        requests.ConnectionError, match=r"Remote end closed connection without response"
    ):
        requests.post(
            f"{fake.url}v3/conversations/{CONVERSATION}/activities",
            json={"type": "message", "text": "x"},
            timeout=5,
        )
    assert len(fake.sent) == 1  # taken: the sender cannot know
