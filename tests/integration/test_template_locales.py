"""A recipient's locale picks the strings a delivery is rendered in, counted at the receiving
server; the locale is pinned on the request (migration 0015), so neither a catalog edit nor the
recipient changing their locale changes what a request already made renders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from clarion import settings
from clarion.catalog.model import EXAMPLES
from clarion.db.engine import engine
from clarion.ops.preview import for_recipient
from clarion.standins.fake_twilio import FakeTwilio
from clarion.tasks import notify, register_recipient, runtime
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.endpoint import Endpoint
from tests.support.pipeline import (
    configure,
    drain,
    publishing_to_this_tests_broker,
    rows,
)
from tests.support.records import recipient as fake_recipient

pytestmark = pytest.mark.integration

V1 = {
    "version": 1,
    "title": "Order {{ order }} is late",
    "body": "It arrives on {{ day }}.",
    "locales": {
        "de": {"title": "Bestellung {{ order }} verspätet sich", "body": "Sie kommt am {{ day }}."},
        "de-AT": {"title": "Bestellung {{ order }} verzögert sich"},
        "fr": {"title": "Commande {{ order }} en retard", "body": "Elle arrive le {{ day }}."},
    },
}
V2 = {  # the edit: a new version whose strings all differ
    "version": 2,
    "title": "NEW {{ order }}",
    "body": "NEW {{ day }}",
    "locales": {"de": {"title": "NEU {{ order }}", "body": "NEU {{ day }}"}},
}
VARIABLES = {"order": "A-1", "day": "Montag"}


def _write(path: Path, *templates: dict[str, Any]) -> Path:
    spec = {
        "category": "transactional",
        "channels": ["webhook"],
        "required": ["order", "day"],
        "templates": list(templates),
    }
    path.write_text(yaml.safe_dump({"types": {"late": spec}}, allow_unicode=True))
    return path


@pytest.fixture
def endpoint(clarion_env, monkeypatch, tmp_path) -> Iterator[Endpoint]:
    with publishing_to_this_tests_broker(), Endpoint() as running:
        configure(monkeypatch, webhook_url=running.url, catalog=_write(tmp_path / "cat.yaml", V1))
        yield running


def _request(user: str, event: str) -> tuple[int, tuple[str, int]]:
    """Notify and route; the request id and the key of its one delivery."""
    made = notify(user, "late", event_id=event, variables=VARIABLES)
    assert route([user], [made.request_id]) == 1
    [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=made.request_id)
    drain("transactional")
    return made.request_id, (row["user_id"], row["id"])


def _states(keys: list[tuple[str, int]]) -> list[str]:
    """The states of these deliveries, in order (the route sends what it routes, in-process)."""
    found = {
        (r["user_id"], r["id"]): r["state"]
        for r in rows("SELECT user_id, id, state FROM deliveries")
    }
    return [found[k] for k in keys]


def _arrived(endpoint: Endpoint) -> dict[str, dict[str, str]]:
    return {c.payload["user_id"]: c.payload["content"] for c in endpoint.calls}


def test_each_recipient_gets_the_strings_of_their_locale_at_the_receiver(endpoint):
    users = {"ann": "en", "bob": "de", "cem": "de-AT", "dee": "fr-CA", "eve": "ja", "fay": "DE-at"}
    keys = []
    for user, locale in users.items():
        register_recipient(user, timezone="Europe/Vienna", locale=locale)
        keys.append(_request(user, "e1")[1])
    assert _states(keys) == ["sent"] * len(keys)  # each route sent its delivery
    assert deliver([k[0] for k in keys], [k[1] for k in keys]) == 0  # nothing left to send
    late_de = "Sie kommt am Montag."
    assert _arrived(endpoint) == {
        "ann": {"title": "Order A-1 is late", "body": "It arrives on Montag."},
        "bob": {"title": "Bestellung A-1 verspätet sich", "body": late_de},
        "cem": {"title": "Bestellung A-1 verzögert sich", "body": late_de},  # de-AT, then de
        "dee": {"title": "Commande A-1 en retard", "body": "Elle arrive le Montag."},
        "eve": {"title": "Order A-1 is late", "body": "It arrives on Montag."},  # no ja: en
        "fay": {"title": "Bestellung A-1 verzögert sich", "body": late_de},  # any case
    }
    assert len(endpoint.calls) == len(users)


def test_a_catalog_edit_or_a_new_locale_after_notify_changes_nothing_in_flight(
    endpoint, monkeypatch, tmp_path
):
    register_recipient("bob", timezone="Europe/Berlin", locale="de")
    # Made before the edit, routed (and so sent: the route sends in-process) after it.
    before = notify("bob", "late", event_id="before", variables=VARIABLES)
    configure(monkeypatch, catalog=_write(tmp_path / "edited.yaml", V1, V2))  # the edit
    register_recipient("bob", timezone="Europe/Berlin", locale="fr")  # and bob moves to French
    request_id = before.request_id
    assert endpoint.calls == []  # nothing rendered yet: the request is in flight
    assert route(["bob"], [request_id]) == 1
    drain("transactional")
    [key] = [
        (r["user_id"], r["id"])
        for r in rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request_id)
    ]
    _, later = _request("bob", "after")
    assert _states([key, later]) == ["sent", "sent"]
    assert deliver([key[0], later[0]], [key[1], later[1]]) == 0  # each route sent its own
    by_event = {c.payload["occurrence_key"]: c.payload["content"] for c in endpoint.calls}
    assert by_event == {
        "event:before": {"title": "Bestellung A-1 verspätet sich", "body": "Sie kommt am Montag."},
        "event:after": {"title": "NEW A-1", "body": "NEW Montag"},  # v2 has no fr: its en
    }
    assert rows("SELECT template_version, locale FROM requests WHERE id = :r", r=request_id) == [
        {"template_version": 1, "locale": "de"}
    ]


def test_every_request_insert_pins_the_recipients_locale(endpoint):
    """The trigger fills requests.locale whatever statement inserts the row (series, summaries
    and digests name no locale), and keeps one a statement gives."""
    register_recipient("cem", timezone="Europe/Vienna", locale="de-AT")
    columns = "user_id, type_key, occurrence_key, lane, template_version, variables, created_at"
    values = "'cem', 'late', :occ, 'transactional', 1, '{}', now()"
    unnamed = text(f"INSERT INTO requests ({columns}) VALUES ({values}) RETURNING locale")
    named = text(
        f"INSERT INTO requests ({columns}, locale) VALUES ({values}, 'fr') RETURNING locale"
    )
    with engine().begin() as conn:
        assert conn.execute(unnamed, {"occ": "x:1"}).scalar_one() == "de-AT"
        assert conn.execute(named, {"occ": "x:2"}).scalar_one() == "fr"


def test_the_sms_twilio_takes_is_what_preview_shows_in_the_recipients_locale(
    clarion_env, monkeypatch
):
    """The demo's order_delayed over the real twilio SDK to the local Twilio: the body in each
    recipient's locale, and the fake's own segment count and encoding equal to the preview's."""

    with FakeTwilio() as fake, publishing_to_this_tests_broker():
        configure(
            monkeypatch,
            catalog=EXAMPLES / "demo.yaml",
            twilio_account_sid=FakeTwilio.ACCOUNT_SID,
            twilio_auth_token=FakeTwilio.AUTH_TOKEN,
            twilio_api_url=fake.url,
            twilio_from=FakeTwilio.NUMBER,
            sms_segments_per_second=100,
        )
        numbers = {"es": "+34600000001", "de-AT": "+43660000002", "en-GB": "+447700900003"}
        variables = {"first_name": "Ana", "order_number": "B-7", "new_date": "2026-12-11"}
        keys = []
        for locale, number in numbers.items():
            user = f"u-{locale}"
            register_recipient(
                user, timezone="Europe/Madrid", locale=locale, addresses={"sms": number}
            )
            made = notify(user, "order_delayed", event_id="e1", variables=variables)
            assert route([user], [made.request_id]) == 1
            [row] = rows(
                "SELECT user_id, id FROM deliveries WHERE request_id = :r", r=made.request_id
            )
            keys.append((row["user_id"], row["id"]))
        drain("transactional")
        assert _states(keys) == ["sent"] * 3  # each route sent its SMS
        assert deliver([k[0] for k in keys], [k[1] for k in keys]) == 0  # nothing left to send

        ntype = runtime.catalog().get("order_delayed")
        for locale, number in numbers.items():
            [taken] = fake.messages(number)
            recipient = fake_recipient(
                user_id=f"u-{locale}", locale=locale, addresses={"sms": number}
            )
            [shown] = for_recipient(
                ntype, recipient, ["sms"], variables, settings.get(), occurrence_key="event:e1"
            )
            assert (taken.body, taken.segments) == (
                shown.request["body"],
                shown.request["segments"],
            )
        assert fake.messages(numbers["es"])[0].body == (
            "Tu pedido B-7 se retrasa: llegará el 2026-12-11."
        )
        assert fake.messages(numbers["de-AT"])[0].body.startswith("Bestellung B-7 verspätet sich")
        assert fake.messages(numbers["en-GB"])[0].body.startswith("Order B-7 is delayed")
        assert len(fake.messages()) == 3
