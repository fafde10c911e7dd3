"""Operator-facing parts of the HTTP API through its real door (Starlette's TestClient on
web.app.create_app) against real PostgreSQL and Redis: key expiry (401 naming it), a key's last
use recorded at most once a minute (on an injected clock), incidents in the request report, the
event_id boundary, and the HTTP API guide's curl bodies (docs/guides/http-api.md) against the demo
catalog."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient

from clarion.tasks import notify, register_recipient
from clarion.tasks.route import route
from clarion.web.api_auth import create_key
from clarion.web.app import create_app
from tests.support.endpoint import Endpoint
from tests.support.environment import ROOT
from tests.support.pipeline import (
    configure,
    count,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

DEMO_CATALOG = ROOT / "catalog" / "examples" / "demo.yaml"


@pytest.fixture(autouse=True)
def _broker(clarion_env) -> Iterator[None]:
    with publishing_to_this_tests_broker():
        yield


@pytest.fixture
def client(clarion_env) -> Iterator[TestClient]:
    register_recipient("ann", timezone="Europe/Berlin")
    with TestClient(create_app()) as c:
        yield c


def receipt(event_id: str = "e1") -> dict[str, Any]:
    return {"event_id": event_id, "user_id": "ann", "type": "receipt", "variables": {"order": "1"}}


def key_row(prefix: str) -> dict[str, Any]:
    [row] = rows("SELECT last_used_at, expires_at FROM api_keys WHERE prefix = :p", p=prefix)
    return row


# --- expiry -------------------------------------------------------------------------------------


def test_a_key_works_until_it_expires_then_is_a_401_naming_the_expiry(client):
    start = datetime.now(UTC).replace(microsecond=0)
    with frozen_clock(start) as clk:
        made = create_key("billing", ["events:write"], expires=timedelta(days=90))
        headers = {"Authorization": f"Bearer {made.secret}"}
        assert made.record.expires_at == start + timedelta(days=90)
        assert key_row(made.record.prefix)["expires_at"] == start + timedelta(days=90)

        clk.advance(90 * 86400 - 1)  # its last second
        assert client.post("/v1/events", json=receipt("e1"), headers=headers).status_code == 202

        clk.advance(1)
        answer = client.post("/v1/events", json=receipt("e2"), headers=headers)
    assert answer.status_code == 401, answer.text
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    expired_at = (start + timedelta(days=90)).isoformat()
    assert answer.json() == {
        "error": "unauthorized",
        "field": "Authorization",
        "reason": f"this API key expired at {expired_at}",
    }
    assert count("requests") == 1  # the refused event wrote nothing


def test_a_key_without_expiry_never_expires(client):
    made = create_key("forever", ["events:write"])
    assert made.record.expires_at is None
    with frozen_clock(datetime.now(UTC) + timedelta(days=3650)):
        answer = client.post(
            "/v1/events", json=receipt(), headers={"Authorization": f"Bearer {made.secret}"}
        )
    assert answer.status_code == 202, answer.text


# --- revocation, with keys cached per process ----------------------------------------------------


def test_a_key_revoked_elsewhere_is_refused_within_the_cache_time_and_here_at_once(client):
    """Each web process keeps a key it read for KEY_CACHE_SECONDS: a revocation written by another
    process (the statement alone, as `clarion keys revoke` on another host) is honoured once that
    passed; a revocation through this process's revoke_key() at once."""
    from clarion.db import api_keys
    from clarion.db.engine import engine
    from clarion.web.api_auth import KEY_CACHE_SECONDS, revoke_key

    start = datetime.now(UTC)
    with frozen_clock(start) as clk:
        elsewhere = create_key("elsewhere", ["events:write"])
        here = create_key("here", ["events:write"])
        sent = 0

        def post(made) -> int:
            nonlocal sent
            sent += 1
            answer = client.post(
                "/v1/events",
                json=receipt(f"e{sent}"),
                headers={"Authorization": f"Bearer {made.secret}"},
            )
            return answer.status_code

        assert post(elsewhere) == post(here) == 202  # both read and cached now
        with engine().begin() as conn:  # another process revokes: this one's cache is not told
            assert api_keys.revoke_key(conn, elsewhere.record.prefix, now=start) is not None
        clk.advance(KEY_CACHE_SECONDS / 2)
        assert post(elsewhere) == 202  # the staleness allowed: at most KEY_CACHE_SECONDS
        clk.advance(KEY_CACHE_SECONDS / 2)
        assert post(elsewhere) == 401  # read again: revoked

        revoke_key(here.record.prefix)  # this process: its cached copy is dropped at once
        assert post(here) == 401
    assert count("requests") == 3


# --- last use -----------------------------------------------------------------------------------


def test_last_used_moves_at_most_once_a_minute(client):
    start = datetime.now(UTC).replace(microsecond=0)
    with frozen_clock(start) as clk:
        made = create_key("billing", ["events:write", "requests:read"])
        headers = {"Authorization": f"Bearer {made.secret}"}
        assert key_row(made.record.prefix)["last_used_at"] is None  # never used yet

        seen = []
        for n, step in enumerate([0, 20, 20, 19.5, 0.5, 30, 30, 59]):
            clk.advance(step)
            answer = client.post("/v1/events", json=receipt(f"e{n}"), headers=headers)
            assert answer.status_code == 202, answer.text
            seen.append((key_row(made.record.prefix)["last_used_at"] - start).total_seconds())
        # used at 0, 20, 40, 59.5, 60, 90, 120 and 179 s: written at 0, 60 and 120 s only
        assert seen == [0, 0, 0, 0, 60, 60, 120, 120]

        # a refused request (no such scope) is not a use
        clk.advance(300)
        client.get("/v1/users/ann/preferences", headers=headers)
        assert (key_row(made.record.prefix)["last_used_at"] - start).total_seconds() == 120


def test_two_processes_reading_a_stale_time_write_last_used_once(client):
    """The write is a conditional UPDATE: a second reader of the same stale time writes nothing."""
    from clarion.db import api_keys
    from clarion.db.engine import engine

    made = create_key("billing", ["events:write"])
    now = datetime.now(UTC)
    with engine().begin() as conn:
        assert api_keys.touch_key(conn, made.record.id, now=now)
    with engine().begin() as conn:  # the other process, a few seconds later, read NULL too
        assert not api_keys.touch_key(conn, made.record.id, now=now + timedelta(seconds=5))
    with engine().begin() as conn:
        assert api_keys.touch_key(conn, made.record.id, now=now + timedelta(seconds=60))
    assert key_row(made.record.prefix)["last_used_at"] == now + timedelta(seconds=60)


# --- incidents and next attempts in the request report ------------------------------------------


def test_a_request_report_lists_its_incidents(client, monkeypatch):
    headers = {"Authorization": f"Bearer {create_key('ops', ['requests:read']).secret}"}
    with Endpoint(lambda call: 409) as endpoint:  # "I already have this idempotency key"
        configure(monkeypatch, webhook_url=endpoint.url)
        request = notify("ann", "receipt", event_id="e1", variables={"order": "1"})
        assert route(["ann"], [request.request_id]) == 1
    assert len(endpoint.calls) == 1
    report = client.get(
        f"/v1/requests/{request.request_id}", params={"user_id": "ann"}, headers=headers
    )
    assert report.status_code == 200, report.text
    [incident] = report.json()["incidents"]
    [stored] = rows("SELECT kind, detail, created_at, delivery_id FROM incidents")
    assert incident == {
        "delivery_id": stored["delivery_id"],
        "channel": "webhook",
        "kind": "repeat",
        "detail": stored["detail"],
        "created_at": stored["created_at"].isoformat().replace("+00:00", "Z"),
    }
    assert stored["kind"] == "repeat"
    [delivery] = report.json()["deliveries"]
    assert (delivery["state"], delivery["next_attempt_at"]) == ("sent", None)


def test_a_request_report_says_when_a_pending_delivery_is_tried_next(client, monkeypatch):
    headers = {"Authorization": f"Bearer {create_key('ops', ['requests:read']).secret}"}
    with Endpoint(lambda call: 408) as endpoint:  # not taken: retried after the policy's wait
        configure(monkeypatch, webhook_url=endpoint.url)
        request = notify("ann", "receipt", event_id="e1", variables={"order": "1"})
        assert route(["ann"], [request.request_id]) == 1
    got = client.get(
        f"/v1/requests/{request.request_id}", params={"user_id": "ann"}, headers=headers
    ).json()
    [row] = rows("SELECT state, greatest(not_before, due_at) AS next FROM deliveries")
    [delivery] = got["deliveries"]
    assert delivery["state"] == row["state"] == "pending"
    assert datetime.fromisoformat(delivery["next_attempt_at"]) == row["next"]
    assert got["incidents"] == []


def test_openapi_documents_incidents_and_next_attempts(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert "incidents" in schemas["RequestReport"]["required"]
    assert schemas["RequestReport"]["properties"]["incidents"]["items"] == {
        "$ref": "#/components/schemas/Incident"
    }
    assert set(schemas["Incident"]["properties"]) == {
        "delivery_id",
        "channel",
        "kind",
        "detail",
        "created_at",
    }
    assert "next_attempt_at" in schemas["Delivery"]["properties"]


# --- event_id: 512 bytes, as docs/guides/http-api.md says -----------------------------------------


@pytest.mark.parametrize(
    "event_id",
    ["x" * 512, "é" * 256, "€" * 170 + "xx", "😀" * 128],
    ids=["ascii", "2-byte", "3-byte", "4-byte"],
)
def test_an_event_id_of_512_bytes_is_accepted_and_513_refused(client, event_id, monkeypatch):
    assert len(event_id.encode()) == 512
    headers = {"Authorization": f"Bearer {create_key('t', ['events:write']).secret}"}
    register_recipient("u" * 256, timezone="UTC")  # the longest user_id too: the index still fits
    body = {**receipt(), "event_id": event_id, "user_id": "u" * 256}
    posted = client.post("/v1/events", json=body, headers=headers)
    assert posted.status_code == 202, posted.text
    request = notify("ann", "receipt", event_id=event_id, variables={"order": "1"})
    assert request.new
    users, ids = ["u" * 256, "ann"], [posted.json()["request_id"], request.request_id]
    with Endpoint() as endpoint:
        configure(monkeypatch, webhook_url=endpoint.url)
        assert route(users, ids) == 2  # and sent: the deliveries' unique index holds the key
    assert len(endpoint.calls) == 2
    keys = rows("SELECT occurrence_key FROM deliveries ORDER BY user_id")
    assert [r["occurrence_key"] for r in keys] == [f"event:{event_id}"] * 2

    too_long = client.post("/v1/events", json={**body, "event_id": event_id + "x"}, headers=headers)
    assert too_long.status_code == 422
    assert too_long.json()["field"] == "event_id"
    assert "at most 512 bytes" in too_long.json()["reason"]
    assert count("requests") == 2


# --- the HTTP API guide's curl bodies ------------------------------------------------------------


GUIDE = ROOT / "docs" / "guides" / "http-api.md"


def _guide_bodies() -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of every `curl … /v1/events…` example with a -d body in the HTTP API guide."""
    guide = GUIDE.read_text()
    found = re.findall(r"curl -sS localhost:8000(/v1/events[^ ]*) .*?-d '(.*?)'", guide, re.S)
    return [(path, json.loads(body)) for path, body in found]


def test_the_guides_event_examples_are_accepted_with_the_demo_catalog(clarion_env, monkeypatch):
    configure(monkeypatch, catalog=DEMO_CATALOG)
    examples = _guide_bodies()
    assert [path for path, _ in examples] == ["/v1/events", "/v1/events/batch"]
    for user in ("user-42", "u1", "u2"):
        register_recipient(user, timezone="Europe/Berlin")
    headers = {"Authorization": f"Bearer {create_key('guide', ['events:write']).secret}"}
    with TestClient(create_app()) as c:
        for path, body in examples:
            answer = c.post(path, json=body, headers=headers)
            assert answer.status_code == 202, (path, answer.text)
    assert count("requests", "type_key = 'order_receipt'") == 3
