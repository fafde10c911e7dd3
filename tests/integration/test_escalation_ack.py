"""Acknowledging a webhook-only escalation chain from outside (issue 23 item 7): the app through
`POST /v1/requests/{id}/ack`, a person through the signed `{{ ack_link }}` of a step's message.
Either stops the chain before its next step: counted at the receivers, the next step's channel
(SMS at the local Twilio) gets nothing. Real PostgreSQL, Redis and clarion web over HTTP; the
pipeline in-process with an injected clock (the world of test_escalation.py)."""

# ruff: noqa: F811 - the tests take the imported fixture `world` as a parameter
from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from clarion.tasks import notify
from clarion.web.api_auth import create_key
from clarion.web.app import create_app
from tests.support.escalation import (
    T0,
    World,
    chain_of,
    escalation_decisions,
    send_request,
    step_requests,
    tick_at,
    world,
)

pytestmark = pytest.mark.integration
__all__ = ["world"]  # a fixture, from tests/support/escalation.py


def _outage() -> int:
    request = notify("ana", "outage_hook", event_id=uuid.uuid4().hex, variables={"host": "db-1"})
    send_request("ana", request.request_id)
    return request.request_id


def _key(*scopes: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_key('ops-bot', scopes).secret}"}


def test_the_app_acknowledges_through_the_api_and_the_next_step_never_fires(world: World):
    request_id = _outage()
    assert world.hooks() == 1
    ack = f"{world.web}/v1/requests/{request_id}/ack"
    headers = _key("escalations:write")
    answer = httpx.post(ack, params={"user_id": "ana"}, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"user_id": "ana", "request_id": request_id, "outcome": "acked"}
    again = httpx.post(ack, params={"user_id": "ana"}, headers=headers)
    assert again.json()["outcome"] == "already_acked"  # idempotent
    for minutes in (5, 15, 60):
        assert tick_at(world, T0 + timedelta(minutes=minutes)) == 0
    assert (world.hooks(), world.sms()) == (1, 0)  # at the receivers: step 2 and 3 sent nothing
    assert step_requests() == []
    assert chain_of(request_id)["state"] == "acked"
    assert chain_of(request_id)["acked_by"].startswith("API key ops-bot (")
    assert escalation_decisions(request_id) == [("wait", "no_ack"), ("stop", "acked")]


def test_refusals_name_the_problem(world: World):
    request_id = _outage()
    ack = f"{world.web}/v1/requests/{request_id}/ack"
    assert httpx.post(ack, params={"user_id": "ana"}).status_code == 401
    wrong = httpx.post(ack, params={"user_id": "ana"}, headers=_key("events:write"))
    assert wrong.status_code == 403
    headers = _key("escalations:write")
    other = httpx.post(ack, params={"user_id": "sam"}, headers=headers)
    assert other.status_code == 404 and other.json()["field"] == "request_id"
    missing = httpx.post(ack, headers=headers)
    assert missing.status_code == 422 and missing.json()["field"] == "user_id"
    assert chain_of(request_id)["state"] == "waiting"  # none of them acknowledged


def test_the_signed_link_in_step_two_stops_step_three(world: World):
    request_id = _outage()
    assert tick_at(world, T0 + timedelta(minutes=5)) == 1
    assert world.hooks() == 2
    [body] = [
        c["body"] for c in world.receiver.arrivals.contents.values() if "Acknowledge" in c["body"]
    ]
    found = re.search(r"(http://\S+/ack\?t=\S+)", body)
    assert found is not None
    link = found.group(1)
    page = httpx.get(link)  # opening it (or a mail scanner fetching it) acknowledges nothing
    assert page.status_code == 200 and "<button" in page.text
    assert chain_of(request_id)["state"] == "waiting"
    pressed = httpx.post(link)
    assert pressed.status_code == 200 and "<h1>Acknowledged</h1>" in pressed.text
    assert "<h1>Already acknowledged</h1>" in httpx.post(link).text  # idempotent
    assert tick_at(world, T0 + timedelta(minutes=15)) == 0
    assert (world.hooks(), world.sms()) == (2, 0)  # step 3's SMS never went
    assert chain_of(request_id)["acked_by"] == "signed link"
    tampered = link[:-3] + ("AAA" if not link.endswith("AAA") else "BBB")
    assert httpx.post(tampered).status_code == 403
    world.clock.now = T0 + timedelta(days=8)  # past the link's 7 days
    assert httpx.get(link).status_code == 410


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    token=st.one_of(
        st.text(max_size=300),
        st.from_regex(r"[A-Za-z0-9_-]{1,80}\.[A-Za-z0-9_-]{1,60}", fullmatch=True),
    ),
    method=st.sampled_from(["GET", "POST"]),
)
def test_fuzzed_links_through_the_door_change_nothing_and_never_fail(ack_door, token, method):
    client, request_id = ack_door
    answer = client.request(method, "/ack", params={"t": token})
    assert answer.status_code == 403, answer.text  # no forged token verifies
    assert answer.headers["content-type"].startswith("text/html")
    assert chain_of(request_id)["state"] == "waiting"


@pytest.fixture
def ack_door(world: World) -> Iterator[tuple[TestClient, int]]:
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        yield client, _outage()
