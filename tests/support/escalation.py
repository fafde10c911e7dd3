"""The escalation tests' world, shared by tests/integration/test_escalation.py and
test_escalation_ack.py: the `world` fixture (local Slack, Twilio and webhook receiver, clarion web,
the recipients ana and sam, a frozen clock at T0), the real tick at a chosen time, and the chain's
rows and recorded decisions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from clarion import settings as clarion_settings
from clarion.standins.fake_slack import FakeSlack, serving
from clarion.standins.fake_twilio import FakeTwilio
from clarion.standins.receiver import Receiver
from clarion.tasks import register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.tasks.tick import _tick
from clarion.web.app import create_app
from tests.support.environment import ROOT
from tests.support.pipeline import (
    Clock,
    configure,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

CATALOG = ROOT / "tests" / "catalog_escalation.yaml"


ANA_PHONE = "+4915112345678"


T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # a Tuesday


Key = tuple[str, int]


@dataclass
class World:
    slack: FakeSlack
    twilio: FakeTwilio
    receiver: Receiver
    clock: Clock
    web: str  # clarion web's base URL

    def sms(self) -> int:
        return len(self.twilio.messages())

    def hooks(self) -> int:
        return self.receiver.arrivals.total

    def slack_posts(self) -> int:
        return len(self.slack.posts())


@pytest.fixture
def world(clarion_env, monkeypatch) -> Iterator[World]:
    secret = clarion_settings.get().webhook_secret
    with (
        FakeSlack() as slack,
        FakeTwilio() as twilio,
        Receiver(secret) as receiver,
        serving(create_app()) as web,
    ):
        configure(
            monkeypatch,
            catalog=CATALOG,
            slack_token=FakeSlack.TOKEN,
            slack_api_url=slack.api_url,
            twilio_account_sid=FakeTwilio.ACCOUNT_SID,
            twilio_auth_token=FakeTwilio.AUTH_TOKEN,
            twilio_api_url=twilio.url,
            twilio_from=FakeTwilio.NUMBER,
            public_url=web,
            sms_segments_per_second=100,
            webhook_url=receiver.url,
        )
        register_recipient("ana", timezone="UTC", addresses={"slack": "U1", "sms": ANA_PHONE})
        register_recipient("sam", timezone="UTC", addresses={"webhook": "https://hooks.example/s"})
        with publishing_to_this_tests_broker(), frozen_clock(T0) as clk:
            yield World(slack, twilio, receiver, clk, web)


def send_request(user: str, request_id: int) -> list[Key]:
    """Route one request and deliver what it created through the real tasks."""
    route([user], [request_id])
    drain("transactional"), drain("activation")
    keys = [
        (r["user_id"], r["id"])
        for r in rows(
            "SELECT user_id, id FROM deliveries WHERE user_id = :u AND request_id = :r",
            u=user,
            r=request_id,
        )
    ]
    for key in keys:
        deliver([key[0]], [key[1]])
    return keys


def tick_at(world: World, at: datetime) -> int:
    """The real beat tick at `at`; the escalation steps it published are routed and delivered."""
    world.clock.now = at
    fired = _tick()["escalations"]
    for name, users, ids in drain("transactional") + drain("activation"):
        if name == "clarion.route":
            for user, request_id in zip(users, ids, strict=True):
                send_request(user, request_id)
    return fired


def chain_of(request_id: int) -> dict:
    [row] = rows(
        "SELECT state, next_step, due_at, acked_by FROM escalations WHERE request_id = :r",
        r=request_id,
    )
    return row


def escalation_decisions(request_id: int) -> list[tuple[str, str]]:
    return [
        (r["outcome"], r["reason"])
        for r in rows(
            "SELECT outcome, reason FROM decisions WHERE request_id = :r AND gate = 'escalation' "
            "ORDER BY id",
            r=request_id,
        )
    ]


def step_requests() -> list[dict]:
    return rows(
        "SELECT user_id, type_key, occurrence_key FROM requests "
        "WHERE occurrence_key LIKE 'escalation:%' ORDER BY id"
    )
