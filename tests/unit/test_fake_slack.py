"""The local Slack (standins/fake_slack.py) records chat.update as Slack applies it and, when told,
rate-limits a method as Slack's tiers do: the real slack_sdk against it, no services."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from clarion.standins.fake_slack import FakeSlack


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeSlack]:
    with FakeSlack(now=clock) as server:
        yield server


@pytest.fixture
def client(fake: FakeSlack) -> WebClient:
    return WebClient(token=FakeSlack.TOKEN, base_url=fake.api_url, retry_handlers=[])


def _post(client: WebClient, text: str = "CPU high on 1 host") -> tuple[str, str]:
    channel = client.conversations_open(users="U1")["channel"]["id"]
    posted = client.chat_postMessage(channel=channel, text=text, blocks=[])
    return str(posted["channel"]), str(posted["ts"])


def test_chat_update_replaces_text_and_blocks_and_keeps_every_update_in_order(fake, client):
    channel, ts = _post(client)
    for n in (2, 3):
        block = {"type": "section", "text": {"type": "mrkdwn", "text": f"{n} hosts"}}
        answer = client.chat_update(channel=channel, ts=ts, text=f"CPU high on {n}", blocks=[block])
        assert (answer["ok"], answer["ts"]) == (True, ts)
    posted = fake.message(channel, ts)
    assert posted is not None
    assert posted.text == "CPU high on 3"
    assert posted.update_texts == ["CPU high on 2", "CPU high on 3"]
    assert [u[0]["text"]["text"] for u in posted.updates] == ["2 hosts", "3 hosts"]
    assert len(fake.called("chat.update", ok=True)) == 2 and len(fake.posts()) == 1


def test_chat_update_of_a_message_slack_does_not_have_is_message_not_found(fake, client):
    channel, _ = _post(client)
    with pytest.raises(SlackApiError, match=r"'error': 'message_not_found'") as caught:
        client.chat_update(channel=channel, ts="1.999999", text="x")
    assert caught.value.response["error"] == "message_not_found"
    assert fake.posts()[0].update_texts == []


def test_a_limited_method_answers_429_with_retry_after_past_its_window(fake, client, clock):
    channel, ts = _post(client)
    fake.limit("chat.update", 2, 60.0)
    for n in range(2):
        client.chat_update(channel=channel, ts=ts, text=f"u{n}")
        clock.now += 1
    with pytest.raises(SlackApiError, match=r"'error': 'ratelimited'") as caught:
        client.chat_update(channel=channel, ts=ts, text="too soon")
    assert caught.value.response.status_code == 429
    assert caught.value.response["error"] == "ratelimited"
    assert int(caught.value.response.headers["Retry-After"]) == 59
    assert fake.throttled("chat.update") == 1
    assert fake.posts()[0].update_texts == ["u0", "u1"]  # the refused call changed nothing
    clock.now += 59  # the first call has left the window
    client.chat_update(channel=channel, ts=ts, text="later")
    assert fake.posts()[0].update_texts[-1] == "later"
    assert len(fake.called("chat.postMessage", ok=True)) == 1  # other methods are not limited
