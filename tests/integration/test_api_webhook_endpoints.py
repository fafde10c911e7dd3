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
