"""Topics and broadcasts through the HTTP door (TestClient on the real app, real PostgreSQL and
Redis): bulk membership, a broadcast started, replayed by its Idempotency-Key, dry-run, followed
and cancelled; bad audiences refused with a 4xx naming the field, writing nothing. (The OpenAPI
document's routes: tests/integration/test_api.py; fuzzed: test_api_schema.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from clarion import settings
from clarion.standins.receiver import Receiver
from clarion.tasks import register_recipient
from clarion.tasks.audiences import MAX_IDS
from clarion.web.app import create_app
from tests.support.api import _broker, as_json, bearer, refused
from tests.support.broadcasts import join, recipients, use_broadcast_catalog, work
from tests.support.pipeline import configure, count, counts, rows

pytestmark = pytest.mark.integration
__all__ = ["_broker"]


@pytest.fixture
def client(clarion_env, monkeypatch) -> Iterator[TestClient]:
    use_broadcast_catalog(monkeypatch)
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def headers(client) -> dict[str, str]:
    return bearer("topics:write", "broadcasts:write", "broadcasts:read")


def test_subscribers_join_and_leave_in_bulk(client, headers):
    users = recipients("u", 12)
    put = client.put("/v1/topics/news/subscribers", json={"user_ids": users}, headers=headers)
    assert put.status_code == 200 and put.json() == {"topic": "news", "changed": 12}
    gone = client.request(
        "DELETE", "/v1/topics/news/subscribers", json={"user_ids": users[:4]}, headers=headers
    )
    assert gone.json() == {"topic": "news", "changed": 4}
    assert count("topic_members") == 8


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"user_ids": [f"u{n}" for n in range(MAX_IDS + 1)]}, 422, "user_ids"),
        ({"user_ids": ["u000000", "ghost"]}, 422, "user_ids"),
        ({"user_ids": "u000000"}, 422, "user_ids"),
        ({"user_ids": ["u000000"], "ids": ["u000000"]}, 422, "ids"),
        ({"user_ids": [f"user-{n:07d}" for n in range(400_000)]}, 413, "body"),
    ],
)
def test_bad_subscriber_calls_are_refused_naming_the_field(client, headers, body, status, field):
    recipients("u", 1)
    before = counts()
    refused(
        client.put("/v1/topics/news/subscribers", **_with(as_json(body), headers)), status, field
    )
    assert counts() == before and count("topic_members") == 0


def _with(kwargs: dict, headers: dict[str, str]) -> dict:
    return {**kwargs, "headers": {**kwargs["headers"], **headers}}


def test_a_bad_topic_key_in_the_path_names_the_topic(client, headers):
    refused(
        client.put("/v1/topics/a%20b/subscribers", json={"user_ids": ["x"]}, headers=headers),
        422,
        "topic",
    )


@pytest.mark.parametrize(
    ("audience", "field"),
    [
        ({"topic": "missing"}, "audience.topic"),
        ({"segment": {"colour": "red"}}, "audience.segment.colour"),
        ({"segment": {"attributes.tier": "gold"}}, "audience.segment.attributes.tier"),
        ({"segment": {"attributes.plan": 2.5}}, "audience.segment.attributes.plan"),
        ({"segment": {"country": []}}, "audience.segment.country"),
        ({"topic": "news", "everyone": True}, "audience.everyone"),
        ({}, "audience"),
    ],
)
def test_bad_audiences_are_refused_naming_the_field(client, headers, audience, field):
    join("news", recipients("u", 2))
    register_recipient("p1", timezone="UTC", attributes={"plan": "pro"})
    body = {"type": "notice", "audience": audience}
    refused(client.post("/v1/broadcasts", json=body, headers=headers), 422, field)
    assert count("broadcasts") == 0 and count("requests") == 0


def test_a_custom_attribute_set_through_put_users_segments_a_broadcast(client, headers):
    auth = {**headers, **bearer("recipients:write")}
    for user, plan in (("p1", "pro"), ("p2", "free"), ("p3", "pro")):
        body = {"timezone": "UTC", "attributes": {"plan": plan}}
        assert client.put(f"/v1/users/{user}", json=body, headers=auth).status_code == 201
    body = {"type": "notice", "audience": {"segment": {"attributes.plan": "pro"}}}
    plan = client.post("/v1/broadcasts", json={**body, "dry_run": True}, headers=headers)
    assert plan.status_code == 200 and plan.json()["planned"] == 2
    started = client.post("/v1/broadcasts", json=body, headers=headers)
    assert started.status_code == 202 and started.json()["planned"] == 2
    work()
    made = rows("SELECT user_id FROM requests ORDER BY user_id")
    assert [r["user_id"] for r in made] == ["p1", "p3"]


def test_a_broadcast_is_started_replayed_followed_and_cancelled(client, headers, monkeypatch):
    join("news", recipients("u", 5) + recipients("de", 2, country="DE", zone="Europe/Berlin"))
    receiver = monkeypatch.context()
    with Receiver(settings.get().webhook_secret) as running, receiver as patch:
        configure(patch, webhook_url=running.url)
        _start_follow_and_cancel(client, headers)
        assert running.arrivals.unique == running.arrivals.total == 5


def _start_follow_and_cancel(client: TestClient, headers: dict[str, str]) -> None:
    body = {"type": "newsletter", "audience": {"topic": "news"}, "variables": {"issue": "1"}}
    keyed = {**headers, "Idempotency-Key": "spring"}
    first = client.post("/v1/broadcasts", json=body, headers=keyed)
    again = client.post("/v1/broadcasts", json=body, headers=keyed)
    assert first.status_code == again.status_code == 202
    assert first.json()["planned"] == 7 and first.json()["new"] is True
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"]
    work()
    shown = client.get(f"/v1/broadcasts/{first.json()['id']}", headers=headers).json()
    assert (shown["state"], shown["planned"], shown["requested"], shown["sent"]) == (
        "done",
        7,
        7,
        5,
    )
    assert shown["suppressed"] == {"opted_out": 2} and shown["waiting"] == 0
    stopped = client.post(f"/v1/broadcasts/{first.json()['id']}/cancel", headers=headers).json()
    assert (stopped["state"], stopped["requested"]) == ("done", 7)  # too late: all requested
    refused(client.get("/v1/broadcasts/999", headers=headers), 404, "broadcast_id")


def test_a_dry_run_answers_counts_and_writes_nothing(client, headers):
    join("news", recipients("u", 3) + recipients("de", 2, country="DE", zone="Europe/Berlin"))
    body = {
        "type": "newsletter",
        "audience": {"topic": "news"},
        "variables": {"issue": "1"},
        "at": "09:00",
        "dry_run": True,
    }
    before = counts()
    answer = client.post("/v1/broadcasts", json=body, headers=headers)
    assert answer.status_code == 200
    assert answer.json() == {
        "planned": 5,
        "skipped": 0,
        "deliver": 3,
        "by_channel": {"webhook": 3},
        "by_reason": {"opted_out": 2},
    }
    assert counts() == before and count("broadcasts") == 0
