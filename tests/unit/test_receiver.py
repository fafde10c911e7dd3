"""The local webhook receiver (standins/receiver.py), the far end every webhook test counts at:
it takes only requests signed by clarion's webhook signer (adapters/webhook.to_request), counts each
arrival by idempotency key (a repeat answers 409), and fails or loses answers when told to."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from clarion.adapters.webhook import to_request
from clarion.records import Message
from clarion.standins.receiver import Receiver

SECRET = "receiver-test-secret"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver(SECRET) as running:
        yield running


def message(occurrence: str = "o1", delivery_id: int = 7) -> Message:
    return Message(
        delivery_id=delivery_id,
        user_id="ann",
        type_key="receipt",
        occurrence_key=occurrence,
        channel="webhook",
        content={"title": "Paid"},
    )


def post(receiver: Receiver, msg: Message, secret: str = SECRET, **changes: str):
    headers, body = to_request(msg, secret, time.time())
    return requests.post(receiver.url, data=body, headers=headers | changes, timeout=5)


def test_a_signed_message_is_counted_once_and_a_repeat_answers_409(receiver):
    first, again = post(receiver, message()), post(receiver, message())
    assert (first.status_code, first.json()) == (200, {"id": 7, "duplicate": False})
    assert (again.status_code, again.json()["duplicate"]) == (409, True)
    a = receiver.arrivals
    assert (a.total, a.unique, a.repeats) == (2, 1, 1)
    assert a.occurrences == {"ann/receipt/o1": {message().idempotency_key}}
    assert a.contents[message().idempotency_key] == {"title": "Paid"}


def test_each_arrival_is_noted_under_its_senders_address(receiver):
    post(receiver, message())
    post(receiver, message())
    [(sender, times)] = receiver.arrivals.senders.items()
    assert sender == "127.0.0.1"  # a multi-host test tells its hosts apart by this
    assert len(times) == 2 and times == sorted(times)
    assert times[0] == receiver.arrivals.first_at[message().idempotency_key]


def test_a_wrong_signature_or_a_stale_timestamp_is_refused_and_not_counted(receiver):
    assert post(receiver, message(), secret="someone-else").status_code == 401
    stale = str(int(time.time()) - 3600)
    assert post(receiver, message(), **{"X-Clarion-Timestamp": stale}).status_code == 401
    assert (receiver.arrivals.total, receiver.arrivals.rejected) == (0, 2)


def test_told_to_fail_it_answers_503_and_takes_nothing(receiver):
    receiver.arrivals.fail_next = 1
    assert post(receiver, message()).status_code == 503
    assert receiver.arrivals.total == 0
    assert post(receiver, message()).status_code == 200


@pytest.mark.parametrize("mode", ["drop", "5xx"])
def test_a_lost_answer_is_counted_all_the_same(receiver, mode):
    receiver.arrivals.losses.next(mode)
    if mode == "drop":
        with pytest.raises(
            requests.ConnectionError, match=r"Remote end closed connection without response"
        ):
            post(receiver, message())
    else:
        assert post(receiver, message()).status_code == 500
    assert receiver.arrivals.total == 1 and receiver.arrivals.losses.applied == [mode]
