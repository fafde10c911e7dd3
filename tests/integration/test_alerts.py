"""Alerts on the injected clock: a webhook provider that starts refusing every send (a revoked
key) opens one send_rate_drop alert for its channel, and a recovery clears it; a request no tick
publishes opens stuck_work, and routing it clears it. Failures are produced at the local receiver
(it answers 503 / 401) and counted there; each firing and clearing arrives signed at a real local
receiver, once, and a receiver that refuses it is tried again; `clarion stats` shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from clarion import settings
from clarion.db.engine import engine
from clarion.ops.stats import report
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.alerts import Reading, evaluate, rate_readings, stuck_readings
from clarion.tasks.deliver import deliver
from clarion.tasks.publish import DELIVER
from clarion.tasks.route import route
from tests.support.pipeline import (
    configure,
    count,
    counted,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

CATALOG = Path(__file__).parents[1] / "catalog_outcomes.yaml"
ALERTS = "SELECT kind, subject, opened_at, cleared_at, value FROM alerts ORDER BY id"


def _send(prefix: str, n: int) -> int:
    """n notifications through route, which sends what it routes itself, as a worker would;
    returns how many were sent."""
    ids = [notify("u1", "receipt_webhook", event_id=f"{prefix}{i}").request_id for i in range(n)]
    route(["u1"] * n, ids)
    drain("activation")
    # nothing is left for a deliver task: no message was published, and none could claim a row
    assert [task for task, _, _ in drain("transactional") if task == DELIVER] == []
    keys = rows("SELECT user_id, id FROM deliveries WHERE request_id = ANY(:ids)", ids=ids)
    assert deliver([k["user_id"] for k in keys], [k["id"] for k in keys]) == 0
    return count("deliveries", "request_id = ANY(:ids) AND state = 'sent'", ids=ids)


@pytest.fixture
def provider(clarion_env, monkeypatch):
    secret = clarion_env.env["CLARION_WEBHOOK_SECRET"]
    with Receiver(secret) as receiver, Receiver(secret) as hooks:
        configure(
            monkeypatch,
            catalog=CATALOG,
            webhook_url=receiver.url,
            alert_webhook_url=hooks.url,
            alert_window=120,
            alert_min_sends=5,
            alert_failure_share=0.5,
        )
        register_recipient("u1", timezone="UTC")
        with publishing_to_this_tests_broker():
            yield receiver, hooks


def test_a_failing_provider_fires_the_rate_alert_and_its_recovery_clears_it(provider):
    receiver, hooks = provider
    with frozen_clock() as clock:
        assert _send("ok", 6) == 6
        assert evaluate() == {"fired": [], "cleared": []}

        clock.advance(150)  # the healthy minutes leave the window
        receiver.arrivals.fail_next = 1000  # the key is revoked: every send is refused
        assert _send("bad", 6) == 0
        assert receiver.arrivals.total == 6  # nothing more was taken ...
        assert evaluate()["fired"] == ["send_rate_drop:webhook"]  # ... and the alert says so
        assert evaluate() == {"fired": [], "cleared": []}  # one open alert, not one a minute
        [fired] = rows(ALERTS)
        assert (fired["kind"], fired["subject"], fired["value"]) == ("send_rate_drop", "webhook", 1)
        assert fired["opened_at"] == clock.read() and fired["cleared_at"] is None
        assert counted("clarion_alerts_open", kind="send_rate_drop", subject="webhook") == 1

        clock.advance(60)  # still failing, fewer than the minimum sends: no change either way
        assert _send("few", 2) == 0
        assert evaluate() == {"fired": [], "cleared": []}

        clock.advance(150)
        receiver.arrivals.fail_next = 0  # a new key: sends are taken again
        assert _send("back", 6) == 6
        assert evaluate()["cleared"] == ["send_rate_drop:webhook"]
        [cleared] = rows(ALERTS)
        assert cleared["cleared_at"] == clock.read()
        assert counted("clarion_alerts_open") == 0

    by_key = dict(hooks.arrivals.by_key)
    alert_id = rows("SELECT id FROM alerts")[0]["id"]
    # each event once, signed (the receiver refuses a bad signature with 401: none were)
    assert by_key == {f"alert:{alert_id}:fired": 1, f"alert:{alert_id}:cleared": 1}
    assert hooks.arrivals.rejected == 0

    shown = report(*settings.get().urls())
    section = shown.split("Alerts (open, and cleared in the last day)\n", 1)[1].split("\n\n")[0]
    [line] = [x for x in section.splitlines() if x.startswith("send_rate_drop")]
    assert line.split()[:2] == ["send_rate_drop", "webhook"] and "OPEN" not in line
    assert line.endswith("6 of 6 sends failed or ended unknown (100%)")


def test_work_nobody_publishes_fires_the_stuck_alarm_and_clears_when_it_moves(provider):
    with frozen_clock() as clock:
        with engine().begin() as conn:  # an outbox row: only a tick would publish it
            request = notify("u1", "receipt_webhook", event_id="s1", connection=conn)
        assert evaluate() == {"fired": [], "cleared": []}
        clock.advance(200)
        assert evaluate() == {"fired": [], "cleared": []}  # 200 s < the 300 s default
        clock.advance(200)
        assert evaluate()["fired"] == ["stuck_work:requests:transactional"]
        shown = report(*settings.get().urls())
        [line] = [x for x in shown.splitlines() if x.startswith("stuck_work")]
        assert line.split()[:2] == ["stuck_work", "requests:transactional"] and "OPEN" in line
        route(["u1"], [request.request_id])  # a tick at last
        assert evaluate()["cleared"] == ["stuck_work:requests:transactional"]
    [alert] = rows(ALERTS)
    assert alert["value"] == 400 and alert["cleared_at"] is not None


def test_a_webhook_that_refuses_is_posted_again_until_it_takes_it(provider, monkeypatch):
    _, hooks = provider
    with Receiver("not-our-secret") as wrong:  # answers 401: our signature is not its secret's
        configure(monkeypatch, alert_webhook_url=wrong.url, alert_stuck_after=10)
        with frozen_clock() as clock:
            with engine().begin() as conn:
                notify("u1", "receipt_webhook", event_id="s1", connection=conn)
            clock.advance(60)
            assert evaluate()["fired"] == ["stuck_work:requests:transactional"]
            assert wrong.arrivals.rejected == 1 and wrong.arrivals.total == 0
            assert rows("SELECT open_posted_at FROM alerts")[0]["open_posted_at"] is None
            configure(monkeypatch, alert_webhook_url=hooks.url, alert_stuck_after=10)
            evaluate()
            evaluate()
    [alert_id] = [r["id"] for r in rows("SELECT id FROM alerts")]
    assert dict(hooks.arrivals.by_key) == {f"alert:{alert_id}:fired": 1}


@pytest.mark.parametrize(
    ("window", "open_", "firing"),
    [
        ({"w": (10, 10)}, set(), True),  # half failing, at the share
        ({"w": (11, 9)}, set(), False),
        ({"w": (0, 4)}, set(), None),  # four failures: too few sends to say either way
        ({"w": (3, 0)}, set(), False),  # few sends, none failing: clears
        ({}, {"w"}, False),  # an open alert on a channel with no sends left: cleared
    ],
)
def test_the_rate_rule(window, open_, firing):
    [reading] = rate_readings(window, open_, share=0.5, min_sends=5)
    assert isinstance(reading, Reading) and reading.firing is firing


def test_the_stuck_rule():
    readings = stuck_readings(
        [("requests", "transactional", 301.0), ("deliveries", "activation", 300.0)], after=300
    )
    assert [(r.subject, r.firing) for r in readings] == [
        ("requests:transactional", True),
        ("deliveries:activation", False),
    ]
