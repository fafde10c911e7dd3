"""Recipients over HTTP and erasure, through the real door (TestClient on web.app.create_app)
against real PostgreSQL and Redis; sends counted at the real webhook receiver (standins/receiver.py).

- PUT /v1/users/{id} creates (201) then replaces (200); GET reads it; bad fields are 4xx naming
  the field; an event's inline `recipient` creates the user in the event's transaction.
- DELETE /v1/users/{id} (and `clarion forget --user`): a scan of every text, JSON and array column
  of every table in clarion's schema, found from the catalog, finds none of the person's addresses
  or variable values; a repeated event for an occurrence sent before is not sent again; a bounced
  address stays suppressed for whoever registers it next."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from clarion.db.engine import engine
from clarion.records import Receipt
from clarion.standins.receiver import Receiver
from clarion.tasks.receipts import ingest
from clarion.tasks.route import route
from clarion.web.api_auth import SCOPES, create_key
from clarion.web.app import create_app
from tests.support.pipeline import (
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
    webhook_receiver,
)

pytestmark = pytest.mark.integration

HOOK = "https://hooks.example/ann-7f3q"  # ann's webhook address: a value to scan for
EMAIL = "ann.secret-9134@example.com"
PHONE = "+4915112349134"
ORDER = "order-ZX81-ann"  # a variable value to scan for
MEMO = "memo-ann-likes-gardening"  # a custom attribute's value to scan for
PERSONAL = (HOOK, EMAIL, PHONE, ORDER, MEMO)
CLARION = Path(sys.executable).parent / "clarion"


# ann keeps quiet hours (22:00-07:00 Berlin) and a Monday-Friday week: the sends here happen on a
# Wednesday at noon in Berlin, whatever the wall clock says when the suite runs.
NOON_IN_BERLIN = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _broker(clarion_env) -> Iterator[None]:
    with publishing_to_this_tests_broker(), frozen_clock(NOON_IN_BERLIN):
        yield


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    with webhook_receiver(monkeypatch) as running:
        yield running


@pytest.fixture
def client(clarion_env) -> Iterator[TestClient]:
    with TestClient(create_app()) as c:
        yield c


def bearer(*scopes: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_key('test', scopes or SCOPES, (10_000, 1)).secret}"}


def ann(**changes: Any) -> dict[str, Any]:
    body = {
        "timezone": "Europe/Berlin",
        "locale": "de-DE",
        "country": "de",
        "addresses": {"webhook": HOOK, "email": EMAIL, "sms": PHONE},
        "quiet_hours": ["22:00", "07:00"],
        "workweek": [0, 1, 2, 3, 4],
        "subdivision": "BY",
        "attributes": {"plan": "pro", "seats": 12, "beta": True, "memo": MEMO},
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


def event(user: str = "ann", event_id: str = "e1", **changes: Any) -> dict[str, Any]:
    body = {"event_id": event_id, "user_id": user, "type": "receipt", "variables": {"order": ORDER}}
    return body | changes


def sent_by_route(response) -> int:
    """Route the accepted request in this process (a send counted at the receiver)."""
    assert response.status_code == 202, response.text
    accepted = response.json()
    if accepted["new"]:
        assert route([accepted["user_id"]], [accepted["request_id"]]) == 1
    drain("transactional")
    return accepted["request_id"]


def scan(values: tuple[str, ...]) -> dict[str, int]:
    """Rows holding any of `values`, per table.column, over every text, JSON and array column of
    every table in clarion's schema (from information_schema, not a hand list)."""
    found: dict[str, int] = {}
    with engine().connect() as conn:
        columns = conn.execute(
            text(
                "SELECT c.table_name, c.column_name FROM information_schema.columns c "
                "JOIN information_schema.tables t USING (table_schema, table_name) "
                "WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' "
                "AND c.data_type IN ('text', 'character varying', 'jsonb', 'json', 'ARRAY')"
            )
        ).all()
        assert {"recipients", "suppressions", "requests", "receipts"} <= {t for t, _ in columns}
        for table, column in columns:
            for value in values:
                hits = conn.execute(
                    text(f'SELECT count(*) FROM "{table}" WHERE strpos("{column}"::text, :v) > 0'),
                    {"v": value},
                ).scalar_one()
                if hits:
                    key = f"{table}.{column}"
                    found[key] = found.get(key, 0) + hits
    return found


def test_put_creates_then_replaces_and_get_reads_it(client):
    auth = bearer("recipients:read", "recipients:write")
    created = client.put("/v1/users/ann", json=ann(), headers=auth)
    assert created.status_code == 201, created.text
    assert created.json()["addresses"] == {"webhook": HOOK, "email": EMAIL, "sms": PHONE}
    replaced = client.put("/v1/users/ann", json=ann(locale="fr", quiet_hours=None), headers=auth)
    assert replaced.status_code == 200, replaced.text
    again = client.put("/v1/users/ann", json=ann(locale="fr", quiet_hours=None), headers=auth)
    assert again.status_code == 200  # idempotent: the same body, the same row
    got = client.get("/v1/users/ann", headers=auth)
    assert got.status_code == 200
    body = got.json()
    assert (body["locale"], body["quiet_hours"], body["workweek"], body["subdivision"]) == (
        "fr",
        None,
        [0, 1, 2, 3, 4],
        "BY",
    )
    assert client.get("/v1/users/nobody", headers=auth).status_code == 404
    assert client.put("/v1/users/ann", json=ann(), headers=bearer("recipients:read")).json()[
        "error"
    ] == ("forbidden")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"timezone": ...}, "timezone"),
        ({"locale": "not a locale!"}, "locale"),
        ({"country": "Deutschland"}, "country"),
        ({"addresses": {"email": "not-an-address"}}, "addresses.email"),
        ({"quiet_hours": ["25:00", "07:00"]}, "quiet_hours[0]"),
        ({"quiet_hours": ["22:00"]}, "quiet_hours"),
        ({"workweek": [9]}, "workweek"),
        ({"workweek": "mon"}, "workweek"),
        ({"nickname": "x"}, "nickname"),
        ({"attributes": "pro"}, "attributes"),
        ({"attributes": {"1st": "a"}}, "attributes.1st"),
        ({"attributes": {"plan": 1.5}}, "attributes.plan"),
        ({"attributes": {"plan": {"tier": 1}}}, "attributes.plan"),
        ({"attributes": {"plan": "x" * 300}}, "attributes.plan"),
        ({"attributes": {f"a{n}": n for n in range(65)}}, "attributes"),
    ],
)
def test_bad_fields_are_a_4xx_naming_the_field(client, changes, field):
    answer = client.put("/v1/users/ann", json=ann(**changes), headers=bearer())
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["field"].startswith(field), answer.json()
    assert rows("SELECT user_id FROM recipients") == []
    assert rows("SELECT name FROM recipient_attribute_names") == []


def test_custom_attributes_are_set_kept_when_omitted_and_cleared_by_an_empty_mapping(client):
    auth = bearer("recipients:read", "recipients:write")
    wanted = {"plan": "pro", "seats": 12, "beta": True, "memo": MEMO}
    assert client.put("/v1/users/ann", json=ann(), headers=auth).json()["attributes"] == wanted
    kept = client.put("/v1/users/ann", json=ann(locale="fr", attributes=...), headers=auth)
    assert kept.status_code == 200 and kept.json()["attributes"] == wanted
    assert (
        client.put("/v1/users/ann", json=ann(attributes=None), headers=auth).json()["attributes"]
        == wanted
    )
    cleared = client.put("/v1/users/ann", json=ann(attributes={}), headers=auth)
    assert cleared.json()["attributes"] == {}
    assert client.get("/v1/users/ann", headers=auth).json()["attributes"] == {}
    names = rows("SELECT name FROM recipient_attribute_names ORDER BY name")
    assert [n["name"] for n in names] == ["beta", "memo", "plan", "seats"]  # names outlive values


def test_an_inline_recipient_creates_the_user_and_the_event_reaches_them(client, receiver):
    body = event(user="cara", recipient=ann(addresses={"webhook": "https://hooks.example/c"}))
    sent_by_route(client.post("/v1/events", json=body, headers=bearer()))
    assert receiver.arrivals.total == 1
    assert rows("SELECT locale, addresses FROM recipients WHERE user_id = 'cara'") == [
        {"locale": "de-DE", "addresses": {"webhook": "https://hooks.example/c"}}
    ]
    [row] = rows("SELECT state FROM deliveries WHERE user_id = 'cara'")
    assert row["state"] == "sent"


def test_an_inline_recipient_is_checked_and_refused_with_the_event(client):
    bad = event(user="dan", recipient=ann(timezone="Nowhere/Else"))
    answer = client.post("/v1/events", json=bad, headers=bearer())
    assert answer.status_code == 422 and answer.json()["field"] == "recipient.timezone"
    batch = {"items": [event(user="dan", event_id="a"), bad]}
    answer = client.post("/v1/events/batch", json=batch, headers=bearer())
    assert answer.status_code == 422 and answer.json()["field"] == "items[1].recipient.timezone"
    answer = client.post(
        "/v1/events", json=event(user="dan", recipient=ann()), headers=bearer("events:write")
    )
    assert answer.status_code == 403 and "recipients:write" in answer.json()["reason"]
    assert rows("SELECT user_id FROM recipients") == []
    assert rows("SELECT id FROM requests") == []


def known_person(client, receiver) -> int:
    """ann with addresses, preferences, a series, a sent receipt and a bounce: her values are in
    many tables. Returns the request id of the sent event."""
    auth = bearer()
    assert client.put("/v1/users/ann", json=ann(), headers=auth).status_code == 201
    prefs = {"settings": {"category:activation/console": False}}
    assert client.put("/v1/users/ann/preferences", json=prefs, headers=auth).status_code == 200
    request_id = sent_by_route(client.post("/v1/events", json=event(), headers=auth))
    assert receiver.arrivals.total == 1
    [delivery] = rows(
        "SELECT provider_message_id FROM deliveries WHERE request_id = :r", r=request_id
    )
    bounce = Receipt(
        channel="webhook",
        event="bounced",
        provider_message_id=delivery["provider_message_id"],
        occurred_at=datetime(2026, 12, 1, tzinfo=UTC),
        address=HOOK,
        detail=f"550 no such mailbox {HOOK}",
    )
    assert ingest([bounce]) == {"applied": 1}
    assert rows("SELECT reason FROM suppressions WHERE user_id = 'ann'") == [{"reason": "bounced"}]
    return request_id


def after_erasure_nothing_personal_stays_and_keys_still_hold(client, receiver) -> None:
    assert scan(PERSONAL) == {}
    auth = bearer()
    assert client.get("/v1/users/ann", headers=auth).status_code == 404
    assert client.get("/v1/users/ann/preferences", headers=auth).status_code == 404
    # a new event for an erased user is refused: she is not a recipient any more
    fresh = client.post("/v1/events", json=event(event_id="e2"), headers=auth)
    assert fresh.status_code == 422 and fresh.json()["error"] == "unknown_recipient"
    # the producer replays the old event, re-creating her inline: the occurrence is known
    again = client.post("/v1/events", json=event(recipient=ann()), headers=auth)
    assert again.status_code == 202 and again.json()["new"] is False, again.text
    sent_by_route(again)
    assert receiver.arrivals.total == 1  # counted at the receiver: not sent twice
    # someone else registers the bounced address: it stays suppressed
    bob = ann(addresses={"webhook": HOOK})
    assert client.put("/v1/users/bob", json=bob, headers=auth).status_code == 201
    request_id = sent_by_route(client.post("/v1/events", json=event(user="bob"), headers=auth))
    assert receiver.arrivals.total == 1
    assert rows(
        "SELECT gate, reason FROM decisions WHERE user_id = 'bob' AND request_id = :r "
        "AND outcome = 'suppress' ORDER BY id",
        r=request_id,
    )[0] == {"gate": "suppression", "reason": "suppressed_address"}


def test_delete_erases_every_personal_value_and_keeps_once_only_and_suppression(client, receiver):
    known_person(client, receiver)
    before = scan(PERSONAL)
    assert {
        "recipients.addresses",
        "recipients.attributes",
        "requests.variables",
        "suppressions.address",
    } <= set(before)
    auth = bearer("recipients:erase")
    erased = client.delete("/v1/users/ann", headers=auth)
    assert erased.status_code == 200, erased.text
    assert erased.json()["changed"]["recipients"] == 1
    assert erased.json()["changed"]["suppressions"] == 1
    [kept] = rows("SELECT address, reason FROM suppressions WHERE user_id = 'ann'")
    assert kept["address"].startswith("hmac:") and kept["reason"] == "bounced"
    repeat = client.delete("/v1/users/ann", headers=auth)  # idempotent
    assert repeat.status_code == 200
    assert repeat.json()["erased_at"] == erased.json()["erased_at"]
    assert set(repeat.json()["changed"].values()) == {0}
    assert client.delete("/v1/users/nobody", headers=auth).status_code == 404
    assert client.delete("/v1/users/ann", headers=bearer("recipients:write")).status_code == 403
    after_erasure_nothing_personal_stays_and_keys_still_hold(client, receiver)


def test_clarion_forget_does_the_same(client, receiver, clarion_env):
    known_person(client, receiver)
    env = {**os.environ, **clarion_env.env}
    done = subprocess.run(
        [str(CLARION), "forget", "--user", "ann"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "erased ann" in done.stdout, done.stderr
    after_erasure_nothing_personal_stays_and_keys_still_hold(client, receiver)
    unknown = subprocess.run(
        [str(CLARION), "forget", "--user", "nobody"], env=env, capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "unknown recipient" in unknown.stderr
    assert "Traceback" not in unknown.stderr
