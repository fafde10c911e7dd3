"""Every attempt of a delivery and its outcome (delivery_attempts, migration 0028), through the
real pipeline: a webhook delivery the receiver answers 503 twice and takes the third time shows
three attempts in db/activity.py's records, on the activity
page, in `GET /v1/requests/{id}` and in `clarion explain`; counted at the receiver too. A 5xx
from a webhook may come after the app took the message (adapters/webhook.py), so those two end
`unknown`: retried, the next attempt reconciling first under the same idempotency key. And the
rows go with retention and lose their words with erasure, like their neighbours'."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from starlette.testclient import TestClient

from clarion import settings
from clarion.db import activity
from clarion.db.engine import engine
from clarion.ops.explain import explain
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.recipients import forget
from clarion.tasks.retention import remove_old
from clarion.tasks.route import route
from clarion.tasks.tick import tick
from clarion.web.activity_view import timeline
from clarion.web.api_auth import create_key
from clarion.web.app import create_app
from tests.support.pipeline import (
    configure,
    count,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration
START = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.fixture
def refused_twice(clarion_env, monkeypatch) -> Iterator[int]:
    """ann's receipt, answered 503 twice by the receiver and sent the third time; its request id."""
    register_recipient("ann", timezone="Europe/Berlin")
    with (
        Receiver(settings.get().webhook_secret) as receiver,
        publishing_to_this_tests_broker(),
        frozen_clock(START) as clk,
    ):
        configure(monkeypatch, webhook_url=receiver.url, max_attempts=5)
        receiver.arrivals.fail_next = 2
        made = notify("ann", "receipt", event_id="order-7", variables={"order": "A-7"})
        assert route(["ann"], [made.request_id]) == 1  # the route's own send: refused
        [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=made.request_id)
        for _ in range(2):  # each retry once due: refused, then taken
            clk.advance(3600)
            tick()
            drain("transactional")
            deliver([row["user_id"]], [row["id"]])
        assert receiver.arrivals.fail_next == 0 and receiver.arrivals.total == 1
        yield made.request_id


def _history(request_id: int) -> activity.RequestHistory:
    with engine().connect() as conn:
        found = activity.request(conn, "ann", request_id)
    assert found is not None
    return found


def test_every_attempt_and_its_outcome_is_in_the_records(refused_twice):
    [delivery] = _history(refused_twice).deliveries
    assert (delivery.state, delivery.attempts) == ("sent", 3)
    tried = delivery.history
    assert [(a.attempt, a.outcome) for a in tried] == [
        (1, "unknown"),
        (2, "unknown"),
        (3, "sent"),
    ]
    assert all(a.error.startswith("http_503") for a in tried[:2]), tried
    assert (tried[2].error, tried[2].platform) == ("", "webhook")
    assert tried[0].at < tried[1].at < tried[2].at  # each at its own attempt's time


def test_the_page_the_api_and_explain_show_the_three_attempts(refused_twice):
    history = _history(refused_twice)
    steps = [s for s in timeline(history, START) if s.reason.startswith("attempt_")]
    assert [(s.what, s.reason) for s in steps] == [
        ("webhook attempt 1: unknown", "attempt_unknown"),
        ("webhook attempt 2: unknown", "attempt_unknown"),
        ("webhook attempt 3: sent", "attempt_sent"),
    ]
    assert "may have arrived" in steps[0].words and steps[0].detail.startswith("http_503")
    reader = create_key("app", ["requests:read"]).secret
    staff = create_key("support", ["activity:read"]).secret
    with TestClient(create_app()) as client:
        got = client.get(
            f"/v1/requests/{refused_twice}",
            params={"user_id": "ann"},
            headers={"Authorization": f"Bearer {reader}"},
        )
        page = client.get(
            f"/activity?request={refused_twice}", headers={"Authorization": f"Bearer {staff}"}
        )
    assert got.status_code == 200, got.text
    [answered] = got.json()["deliveries"]
    assert [(a["attempt"], a["outcome"]) for a in answered["history"]] == [
        (1, "unknown"),
        (2, "unknown"),
        (3, "sent"),
    ]
    assert [s["reason"] for s in got.json()["timeline"] if s["reason"].startswith("attempt_")] == [
        "attempt_unknown",
        "attempt_unknown",
        "attempt_sent",
    ]
    assert page.status_code == 200
    for n, outcome in ((1, "unknown"), (2, "unknown"), (3, "sent")):
        assert f"webhook attempt {n}: {outcome}" in page.text
    told = explain("ann")
    assert "#1" in told and "#2" in told and "#3" in told and "http_503" in told


def test_retention_and_erasure_treat_attempts_like_their_neighbours(refused_twice, monkeypatch):
    assert count("delivery_attempts", "error <> ''") == 2
    assert forget("ann") is not None
    assert count("delivery_attempts", "error <> ''") == 0
    assert count("delivery_attempts") == 3  # numbers and outcomes stay: explain still says them
    configure(monkeypatch, retention_days=1)
    remove_old(START + timedelta(days=3))
    assert count("requests") == 0 and count("delivery_attempts") == 0
