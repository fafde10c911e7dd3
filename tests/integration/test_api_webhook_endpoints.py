"""/v1/webhook-endpoints through the real door (TestClient on web.app.create_app): register, list,
show, change, rotate, enable, delete; the scope; bad input refused naming the field, with nothing
written."""

from __future__ import annotations

import pytest

from clarion.adapters.standard_webhooks import key_of
from tests.support.api import _broker, bearer, client, refused
from tests.support.pipeline import count

__all__ = ["_broker", "client"]
pytestmark = pytest.mark.integration
PATH = "/v1/webhook-endpoints"


def test_register_list_change_rotate_and_delete(client):
    auth = bearer("webhooks:manage")
    made = client.post(PATH, json={"url": "https://app.example/h", "kinds": ["*"]}, headers=auth)
    assert made.status_code == 201, made.text
    body = made.json()
    assert len(key_of(body["secret"])) == 32 and "delivery.bounced" in body["kinds"]
    listed = client.get(PATH, headers=auth).json()["items"]
    assert [(e["id"], e["secret"]) for e in listed] == [(body["id"], None)]  # shown once
    one = f"{PATH}/{body['id']}"
    changed = client.patch(
        one, json={"kinds": ["delivery.bounced"], "enabled": False}, headers=auth
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["kinds"], changed.json()["enabled"]) == (["delivery.bounced"], False)
    rotated = client.patch(
        one, json={"rotate_secret": True, "overlap_seconds": 60, "enabled": True}, headers=auth
    ).json()
    assert rotated["secret"] not in (None, body["secret"]) and rotated["enabled"] is True
    assert rotated["previous_secret_until"] is not None
    assert client.delete(one, headers=auth).status_code == 204
    refused(client.get(one, headers=auth), 404, "endpoint_id")
    refused(client.delete(one, headers=auth), 404, "endpoint_id")
    assert count("webhook_endpoints") == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://x", "kinds": ["*"]}, "url"),
        ({"url": "https://a.example/", "kinds": ["delivery.lost"]}, "kinds"),
        ({"url": "https://a.example/", "kinds": []}, "kinds"),
        ({"url": "https://a.example/", "kinds": ["*"], "secret": "whsec_???"}, "secret"),
        ({"url": "https://a.example/", "kinds": ["*"], "extra": 1}, "extra"),
        ({"url": 5, "kinds": ["*"]}, "url"),
    ],
)
def test_bad_input_is_refused_naming_the_field(client, body, field):
    refused(client.post(PATH, json=body, headers=bearer("webhooks:manage")), 422, field)
    assert count("webhook_endpoints") == 0


def test_the_scope_is_required(client):
    refused(client.get(PATH, headers=bearer("events:write")), 403, "Authorization")
    refused(client.get(PATH), 401, "Authorization")


def test_the_request_report_lists_its_outbound_events_and_who_took_them(client, monkeypatch):
    from clarion.standins.receiver import Receiver
    from clarion.tasks import event_endpoints, notify, register_recipient
    from clarion.tasks.route import route
    from tests.support.pipeline import configure

    register_recipient("ann", timezone="UTC")
    event_endpoints.create("http://127.0.0.1:9/", ["request.accepted", "delivery.sent"])
    with Receiver("clarion-test-secret") as receiver:
        configure(monkeypatch, webhook_url=receiver.url)
        made = notify("ann", "receipt", event_id="e1", variables={"order": "1"})
        route(["ann"], [made.request_id])
    answer = client.get(
        f"/v1/requests/{made.request_id}",
        params={"user_id": "ann"},
        headers=bearer("requests:read"),
    )
    assert answer.status_code == 200, answer.text
    events = answer.json()["events"]
    assert [(e["kind"], e["taken"], e["pending"]) for e in events] == [
        ("request.accepted", 0, 1),
        ("delivery.sent", 0, 1),
    ]
    assert events[0]["id"] == f"evt_{events[0]['sequence']}"
    assert events[1]["channel"] == "webhook" and events[1]["delivery_id"] is not None
