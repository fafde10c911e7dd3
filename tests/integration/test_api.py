"""The HTTP API through its real door (Starlette's TestClient on web.app.create_app) against real
PostgreSQL and Redis: ingest single and batch (rows written, route task on the lane's queue),
every refusal naming its field and writing nothing, API keys (401/403, the CLI), per-key rate
limits, request reports, preferences and the OpenAPI document.

Idempotency-Key is tested in test_api_idempotency.py, fuzzed bodies in test_api_fuzz.py."""

from __future__ import annotations

import hashlib

import pytest

from clarion.tasks import register_recipient
from clarion.tasks.publish import ROUTE
from clarion.tasks.route import route
from clarion.web.api_auth import create_key
from tests.support.api import (
    _broker,
    ann,
    as_json,
    bearer,
    client,
    event,
    nested,
    nothing_published,
    refused,
    written,
)
from tests.support.pipeline import count, published, rows

pytestmark = pytest.mark.integration
__all__ = ["_broker", "ann", "client"]  # fixtures, from tests/support/api.py


# --- ingest -------------------------------------------------------------------------------------


def test_an_event_is_written_and_its_route_task_published(client, ann):
    headers = bearer("events:write")
    first = client.post("/v1/events", json=event(), headers=headers)
    assert first.status_code == 202
    body = first.json()
    assert body == {
        "request_id": body["request_id"],
        "user_id": "ann",
        "type": "receipt",
        "event_id": "e1",
        "lane": "transactional",
        "new": True,
    }
    [row] = rows("SELECT user_id, id, type_key, occurrence_key, lane, variables FROM requests")
    assert row == {
        "user_id": "ann",
        "id": body["request_id"],
        "type_key": "receipt",
        "occurrence_key": "event:e1",
        "lane": "transactional",
        "variables": {"order": "A-1"},
    }
    assert published("transactional")[ROUTE] == [("ann", body["request_id"])]
    # published at once, so the tick leaves it alone for the stray window (as notify() does)
    [due] = rows("SELECT due_at - created_at AS wait FROM requests")
    assert due["wait"].total_seconds() == pytest.approx(30, abs=1)

    again = client.post("/v1/events", json=event(), headers=headers)
    assert again.status_code == 202 and again.json() == {**body, "new": False}
    assert count("requests") == 1 and nothing_published()


def test_a_batch_is_written_together_and_published_per_lane(client, ann):
    register_recipient("bob", timezone="America/New_York")
    items = [
        event(),
        event(user_id="bob", event_id="e2"),
        event(type="nudge", variables={"name": "Ann"}, priority="activation"),
        event(event_id="e1"),  # the first one again, in the same batch
    ]
    answer = client.post("/v1/events/batch", json={"items": items}, headers=bearer())
    assert answer.status_code == 202, answer.text
    got = answer.json()["items"]
    assert [(a["user_id"], a["lane"], a["new"]) for a in got] == [
        ("ann", "transactional", True),
        ("bob", "transactional", True),
        ("ann", "activation", True),
        ("ann", "transactional", False),
    ]
    assert got[3]["request_id"] == got[0]["request_id"]
    assert count("requests") == 3
    assert sorted(published("transactional")[ROUTE]) == sorted(
        [("ann", got[0]["request_id"]), ("bob", got[1]["request_id"])]
    )
    assert published("activation")[ROUTE] == [("ann", got[2]["request_id"])]


def test_a_dedup_key_makes_two_events_one_request(client, ann):
    headers = bearer()
    one = client.post(
        "/v1/events", json=event(event_id="e1", dedup_key="order:A-1"), headers=headers
    )
    two = client.post(
        "/v1/events", json=event(event_id="e2", dedup_key="order:A-1"), headers=headers
    )
    assert (one.status_code, two.status_code) == (202, 202)
    assert one.json()["request_id"] == two.json()["request_id"]
    assert (one.json()["new"], two.json()["new"]) == (True, False)
    assert rows("SELECT occurrence_key FROM requests") == [{"occurrence_key": "order:A-1"}]


REFUSED = {
    "unknown type": (event(type="no_such_type"), "type", "unknown_type"),
    "missing variable": (event(variables={}), "variables", "missing_variables"),
    "no variables at all": (event(variables=...), "variables", "missing_variables"),
    "unknown recipient": (event(user_id="zed"), "user_id", "unknown_recipient"),
    "event_id missing": (event(event_id=...), "event_id", "invalid_field"),
    "event_id a number": (event(event_id=7), "event_id", "invalid_field"),
    "event_id empty": (event(event_id=""), "event_id", "invalid_field"),
    "event_id with NUL": (event(event_id="a\x00b"), "event_id", "invalid_field"),
    "event_id too long": (event(event_id="x" * 600), "event_id", "invalid_field"),
    "event_id bad beside a dedup key": (
        event(event_id="a\x00", dedup_key="k"),
        "event_id",
        "invalid_field",
    ),
    "user_id a lone surrogate": (event(user_id="\ud800"), "user_id", "invalid_field"),
    "dedup_key reserved": (event(dedup_key="series:1:2"), "dedup_key", "invalid_field"),
    "dedup_key empty": (event(dedup_key=""), "dedup_key", "invalid_field"),
    "variables a list": (event(variables=["A-1"]), "variables", "invalid_field"),
    "variable too big an int": (
        event(variables={"order": 2**64}),
        "variables.order",
        "invalid_field",
    ),
    "variable with NUL": (event(variables={"order": "\x00"}), "variables.order", "invalid_field"),
    "variables too deep": (
        event(variables={"order": "A", "x": nested(18)}),
        "variables.x" + "[0]" * 15,  # the 17th level: the variables mapping is the first
        "invalid_field",
    ),
    "priority of another lane": (event(priority="activation"), "priority", "invalid_field"),
    "priority not a lane": (event(priority=0), "priority", "invalid_field"),
    "an unknown member": (event(colour="red"), "colour", "invalid_field"),
}


@pytest.mark.parametrize("body, field, code", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_event_names_its_field_and_writes_nothing(client, ann, body, field, code):
    headers = bearer()
    before = written()
    sent = as_json(body)
    answer = client.post(
        "/v1/events", content=sent["content"], headers={**headers, **sent["headers"]}
    )
    assert refused(answer, 422, field)["error"] == code
    assert written() == before and nothing_published()


def test_a_batch_is_refused_whole_with_the_index_of_the_bad_item(client, ann):
    good = [event(event_id=f"e{i}") for i in range(5)]
    cases = {
        3: (event(event_id="x", variables={}), "items[3].variables"),
        1: (event(event_id="x", user_id="zed"), "items[1].user_id"),
        4: (event(event_id="x", priority="activation"), "items[4].priority"),
        2: (event(event_id="x", type="nope"), "items[2].type"),
        0: (event(event_id="x", dedup_key="series:x"), "items[0].dedup_key"),
    }
    headers = bearer()
    before = written()
    for index, (bad, field) in cases.items():
        items = [*good[:index], bad, *good[index + 1 :]]
        refused(client.post("/v1/events/batch", json={"items": items}, headers=headers), 422, field)
    refused(client.post("/v1/events/batch", json={"items": []}, headers=headers), 422, "items")
    refused(
        client.post("/v1/events/batch", json={"items": [event()] * 501}, headers=headers),
        422,
        "items",
    )
    refused(client.post("/v1/events/batch", json=[event()], headers=headers), 422, "body")
    assert written() == before and nothing_published()


def test_bodies_that_are_not_json_objects_are_refused_at_the_body(client, ann):
    headers = bearer()
    before = written()
    post = client.post
    refused(
        post("/v1/events", content=b"{", headers={**headers, "Content-Type": "application/json"}),
        400,
        "body",
    )
    refused(
        post(
            "/v1/events", content=b"\xff", headers={**headers, "Content-Type": "application/json"}
        ),
        400,
        "body",
    )
    refused(
        post(
            "/v1/events",
            content=b"[" * 100_000,
            headers={**headers, "Content-Type": "application/json"},
        ),
        400,
        "body",
    )
    refused(post("/v1/events", json=[1], headers=headers), 422, "body")
    refused(
        post(
            "/v1/events",
            content=b"x" * 300_000,
            headers={**headers, "Content-Type": "application/json"},
        ),
        413,
        "body",
    )
    refused(
        post("/v1/events", content=b"{}", headers={**headers, "Content-Type": "text/plain"}),
        415,
        "Content-Type",
    )
    refused(post("/v1/events", data={"event_id": "e1"}, headers=headers), 415, "Content-Type")
    assert written() == before and nothing_published()


# --- API keys -----------------------------------------------------------------------------------


def test_every_unauthenticated_request_is_a_401_before_its_body_is_read(client, ann, capsys):
    from clarion.ops.cli import main

    live = create_key("live", ["events:write"]).secret
    revoked = create_key("gone", ["events:write"]).secret
    with pytest.raises(SystemExit, match=r"^0$") as done:
        main(["keys", "revoke", revoked.split("_")[1]])
    assert done.value.code == 0
    prefix = live.split("_")[1]
    headers = {
        "none": {},
        "not bearer": {"Authorization": f"Basic {live}"},
        "not a key": {"Authorization": "Bearer hunter2"},
        "unknown key": {"Authorization": f"Bearer clk_{'0' * 12}_{'A' * 43}"},
        "right prefix, wrong secret": {"Authorization": f"Bearer clk_{prefix}_{'A' * 43}"},
        "revoked": {"Authorization": f"Bearer {revoked}"},
    }
    before = written()
    for name, header in headers.items():
        answer = client.post(  # a body that is not even JSON: the key is checked first
            "/v1/events", content=b"\xff{", headers={**header, "Content-Type": "application/json"}
        )
        body = refused(answer, 401, "Authorization")
        assert answer.headers["WWW-Authenticate"] == "Bearer", name
        assert body["error"] == "unauthorized", name
    assert "revoked" in client.post("/v1/events", json=event(), headers=headers["revoked"]).text
    assert written() == before
    assert (
        client.post(
            "/v1/events", json=event(), headers={"Authorization": f"Bearer {live}"}
        ).status_code
        == 202
    )


def test_a_key_without_the_scope_is_a_403(client, ann):
    reader = bearer("requests:read", "preferences:read")
    writer = bearer("events:write")
    before = written()
    refused(client.post("/v1/events", json=event(), headers=reader), 403, "Authorization")
    refused(
        client.post("/v1/events/batch", json={"items": [event()]}, headers=reader),
        403,
        "Authorization",
    )
    refused(client.get("/v1/requests/1?user_id=ann", headers=writer), 403, "Authorization")
    refused(client.get("/v1/users/ann/preferences", headers=writer), 403, "Authorization")
    refused(
        client.put("/v1/users/ann/preferences", json={"settings": {}}, headers=reader),
        403,
        "Authorization",
    )
    assert written() == before


def test_keys_are_shown_once_and_stored_hashed(clarion_env, capsys):
    from clarion.ops.cli import main

    with pytest.raises(SystemExit, match=r"^0$"):
        main(["keys", "create", "--name", "billing", "--scope", "events:write", "--rate", "50/10s"])
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("clk_")
    [stored] = rows("SELECT * FROM api_keys")
    assert stored["secret_sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    # The secret half is base64url, which may itself contain "_": split at the first two only.
    assert secret not in str(stored) and secret.split("_", 2)[2] not in str(stored)
    assert (stored["scopes"], stored["rate_limit"], stored["rate_window"]) == (
        ["events:write"],
        50,
        10,
    )
    with pytest.raises(SystemExit, match=r"^0$"):
        main(["keys", "list"])
    listed = capsys.readouterr().out
    assert (
        stored["prefix"] in listed and "billing" in listed and secret.split("_", 2)[2] not in listed
    )
    with pytest.raises(SystemExit, match=r"^2$") as bad:
        main(["keys", "create", "--name", "x", "--scope", "everything"])
    assert bad.value.code == 2 and "unknown scope everything" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^0$") as twice:
        main(["keys", "revoke", stored["prefix"]])
        main(["keys", "revoke", stored["prefix"]])
    assert twice.value.code == 0
    with pytest.raises(SystemExit, match=r"^2$") as again:
        main(["keys", "revoke", stored["prefix"]])
    assert again.value.code == 2 and "no live API key" in capsys.readouterr().err


def test_over_the_keys_rate_is_a_429_with_retry_after_then_it_recovers(client, ann):
    import time

    slow = bearer("events:write", rate=(3, 1))
    other = bearer("events:write")
    codes = [
        client.post("/v1/events", json=event(event_id=f"e{i}"), headers=slow).status_code
        for i in range(3)
    ]
    assert codes == [202, 202, 202]
    before = written()
    over = client.post("/v1/events", json=event(event_id="e9"), headers=slow)
    body = refused(over, 429, None)
    assert body["error"] == "rate_limited" and over.headers["Retry-After"] == "1"
    assert written() == before  # nothing of the refused request
    # the budget is per key: another key is not slowed down
    assert client.post("/v1/events", json=event(event_id="o1"), headers=other).status_code == 202
    time.sleep(int(over.headers["Retry-After"]))  # the wait the answer promised, no more
    assert client.post("/v1/events", json=event(event_id="e9"), headers=slow).status_code == 202


# --- reading --------------------------------------------------------------------------------------


def test_a_request_report_has_its_decisions_and_deliveries(client, ann):
    headers = bearer()
    posted = client.post("/v1/events", json=event(), headers=headers).json()
    request_id = posted["request_id"]
    pending = client.get(f"/v1/requests/{request_id}", params={"user_id": "ann"}, headers=headers)
    assert pending.status_code == 200
    assert pending.json()["state"] == "pending" and pending.json()["deliveries"] == []

    route(["ann"], [request_id])
    report = client.get(f"/v1/requests/{request_id}", params={"user_id": "ann"}, headers=headers)
    assert report.status_code == 200
    got = report.json()
    assert (got["id"], got["user_id"], got["type"], got["occurrence_key"], got["state"]) == (
        request_id,
        "ann",
        "receipt",
        "event:e1",
        "routed",
    )
    stored = rows(
        "SELECT channel, state, attempts FROM deliveries WHERE request_id = :r", r=request_id
    )
    assert [
        {k: d[k] for k in ("channel", "state", "attempts")} for d in got["deliveries"]
    ] == stored
    assert stored  # the report shows something that happened
    decided = rows(
        "SELECT gate, outcome, reason FROM decisions WHERE request_id = :r", r=request_id
    )
    assert [{k: d[k] for k in ("gate", "outcome", "reason")} for d in got["decisions"]] == decided

    register_recipient("bob", timezone="Europe/Berlin")
    refused(
        client.get(f"/v1/requests/{request_id}", params={"user_id": "bob"}, headers=headers),
        404,
        "request_id",
    )
    refused(
        client.get("/v1/requests/abc", params={"user_id": "ann"}, headers=headers),
        422,
        "request_id",
    )
    refused(
        client.get(f"/v1/requests/{2**63}", params={"user_id": "ann"}, headers=headers),
        422,
        "request_id",
    )
    refused(client.get(f"/v1/requests/{request_id}", headers=headers), 422, "user_id")
    refused(
        client.get(f"/v1/requests/{request_id}", params={"user_id": "a\x00"}, headers=headers),
        422,
        "user_id",
    )


def test_preferences_round_trip_through_the_preference_functions(client, ann):
    from clarion.tasks.preferences import get_preferences

    headers = bearer()
    start = client.get("/v1/users/ann/preferences", headers=headers)
    assert start.status_code == 200 and start.json() == get_preferences("ann")
    assert start.json()["types"]["nudge"]["webhook"]["enabled"] is True

    put = client.put(
        "/v1/users/ann/preferences", json={"settings": {"type:nudge": False}}, headers=headers
    )
    assert put.status_code == 200, put.text
    assert put.json()["settings"] == {"type:nudge": False}
    assert put.json()["types"]["nudge"]["webhook"]["enabled"] is False
    # settings not named are kept; null removes one
    client.put(
        "/v1/users/ann/preferences",
        json={"settings": {"category:activation/console": False}},
        headers=headers,
    )
    both = client.get("/v1/users/ann/preferences", headers=headers).json()["settings"]
    assert both == {"type:nudge": False, "category:activation/console": False}
    cleared = client.put(
        "/v1/users/ann/preferences", json={"settings": {"type:nudge": None}}, headers=headers
    )
    assert cleared.json()["settings"] == {"category:activation/console": False}
    assert get_preferences("ann")["settings"] == {"category:activation/console": False}

    before = rows("SELECT * FROM preferences ORDER BY key")
    bad = {
        "type:receipt": (False, "settings.type:receipt"),  # transactional: cannot be turned off
        "type:nope": (False, "settings.type:nope"),
        "category:activation/pigeon": (False, "settings.category:activation/pigeon"),
        "type:nudge": ("off", "settings.type:nudge"),
    }
    for name, (value, field) in bad.items():
        answer = client.put(
            "/v1/users/ann/preferences",
            json={"settings": {"type:nudge": True, name: value}},  # one good, one bad: neither
            headers=headers,
        )
        refused(answer, 422, field)
    refused(
        client.put("/v1/users/ann/preferences", json={"type:nudge": True}, headers=headers),
        422,
        "settings",
    )
    assert rows("SELECT * FROM preferences ORDER BY key") == before
    refused(client.get("/v1/users/zed/preferences", headers=headers), 404, "user_id")
    refused(
        client.put("/v1/users/zed/preferences", json={"settings": {}}, headers=headers),
        404,
        "user_id",
    )


def test_a_user_id_with_a_slash_reaches_its_preferences(client, clarion_env):
    register_recipient("org/ann", timezone="Europe/Berlin")
    answer = client.get("/v1/users/org%2Fann/preferences", headers=bearer())
    assert answer.status_code == 200 and answer.json()["user_id"] == "org/ann"


# --- the document -------------------------------------------------------------------------------


def test_openapi_is_valid_and_lists_every_endpoint(client):
    from openapi_spec_validator import validate

    answer = client.get("/openapi.json")
    assert answer.status_code == 200
    doc = answer.json()
    validate(doc)
    assert {p: sorted(doc["paths"][p]) for p in doc["paths"]} == {
        "/v1/events": ["post"],
        "/v1/events/batch": ["post"],
        "/v1/requests/{request_id}": ["get"],
        "/v1/requests/{request_id}/ack": ["post"],
        "/v1/users/{user_id}/preferences": ["get", "put"],
        "/v1/users/{user_id}": ["delete", "get", "put"],
        "/v1/inbox/{user_id}": ["get"],
        "/v1/inbox/{user_id}/mark": ["post"],
        "/v1/inbox/{user_id}/stream": ["get"],
        "/v1/webhook-endpoints": ["get", "post"],
        "/v1/webhook-endpoints/{endpoint_id}": ["delete", "get", "patch"],
        "/v1/topics/{topic}/subscribers": ["delete", "put"],
        "/v1/broadcasts": ["post"],
        "/v1/broadcasts/{broadcast_id}": ["get"],
        "/v1/broadcasts/{broadcast_id}/cancel": ["post"],
    }
    post = doc["paths"]["/v1/events"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Event"
    }
    assert set(doc["components"]["schemas"]["Event"]["properties"]) == {
        "event_id",
        "user_id",
        "type",
        "variables",
        "dedup_key",
        "priority",
        "recipient",
    }
    error = {"$ref": "#/components/schemas/Error"}
    for status in ("401", "403", "422", "429"):
        assert post["responses"][status]["content"]["application/json"]["schema"] == error
    scheme = doc["components"]["securitySchemes"]["ApiKey"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    inbox_token = [{"InboxToken": []}, {"InboxTokenQuery": []}]
    for path, ops in doc["paths"].items():
        expected = inbox_token if path.startswith("/v1/inbox/") else [{"ApiKey": []}]
        assert all(op["security"] == expected for op in ops.values()), path
    stream = doc["paths"]["/v1/inbox/{user_id}/stream"]["get"]["responses"]
    assert list(stream["200"]["content"]) == ["text/event-stream"]
    assert stream["401"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InboxRefusal"
    }
    feed = doc["paths"]["/v1/inbox/{user_id}"]["get"]["responses"]["200"]
    assert feed["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InboxFeed"
    }
    docs = client.get("/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text


@pytest.mark.direct(
    "its own unmigrated database, which the pooler fixture has not given clarion's search_path"
)
def test_an_unmigrated_database_is_a_503_saying_so_not_a_traceback(
    client, unmigrated_database, monkeypatch
):
    from tests.support.pipeline import configure

    configure(monkeypatch, database_url=unmigrated_database)
    key = {"Authorization": f"Bearer clk_{'0' * 12}_{'A' * 43}"}
    answer = client.post("/v1/events", json=event(), headers=key)
    body = refused(answer, 503, None)
    assert body["error"] == "unavailable" and "clarion migrate" in body["reason"]


def test_the_chat_doors_and_healthz_still_answer(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    refused(client.get("/v1/nowhere"), 404, None)
    assert client.get("/nowhere").status_code == 404
