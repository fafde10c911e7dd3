"""A gate added by one module and one registration line, against real PostgreSQL: the dry run
(`clarion send --dry-run`: tasks.planning.preview) and the real route agree on it, and on the rows
it reads of its own with the snapshot (tests/support/weekday_gate.py: first contact on a weekend)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection

from clarion import settings
from clarion.gates.contract import Channels, ClaimContext, Context, Plan, asked, with_step
from clarion.gates.pipeline import register, unregister
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.planning import preview
from clarion.tasks.route import route
from tests.support.gates import (
    VirtualClock,
    decisions_of,
    deliveries_of,
    fresh_event,
    send_and_route,
    use_gates_catalog,
)
from tests.support.pipeline import configure
from tests.support.weekday_gate import GATE

pytestmark = pytest.mark.integration

FRIDAY = datetime(2026, 12, 4, 11, 0, tzinfo=UTC)  # 12:00 in Berlin
SATURDAY = datetime(2026, 12, 5, 11, 0, tzinfo=UTC)
MONDAY = datetime(2026, 12, 7, 11, 0, tzinfo=UTC)


@pytest.fixture
def weekday_gate(clarion_env, monkeypatch) -> Iterator[Receiver]:
    use_gates_catalog(monkeypatch)
    register(GATE, before="quiet_hours", snapshot=GATE)
    try:
        with Receiver(settings.get().webhook_secret) as running:
            configure(monkeypatch, webhook_url=running.url)
            yield running
    finally:
        unregister("weekday_only")


@pytest.mark.parametrize(
    ("at", "contacted", "outcome", "reason"),
    [
        pytest.param(SATURDAY, True, "suppress", "weekend", id="weekend"),
        pytest.param(SATURDAY, False, "deliver", "first_contact", id="weekend-first-contact"),
        pytest.param(MONDAY, True, "deliver", "weekday", id="weekday"),
    ],
)
def test_the_dry_run_and_the_route_agree_on_a_new_gate(
    weekday_gate, at, contacted, outcome, reason
) -> None:
    clock = VirtualClock(FRIDAY)
    try:
        register_recipient("wes", timezone="Europe/Berlin")
        if contacted:  # a receipt on Friday: the gate's own snapshot rows count it
            assert deliveries_of("wes", send_and_route("wes", "receipt", {"order": "A-0"}))
        clock.set(at)
        event = fresh_event()
        planned = preview("wes", "receipt", event_id=event, variables={"order": "A-1"})
        assert planned.outcome == outcome
        assert [s.reason for s in planned.steps if s.gate == "weekday_only"] == [reason]
        request_id = notify("wes", "receipt", event_id=event, variables={"order": "A-1"}).request_id
        assert route(["wes"], [request_id]) == 1
        expected = [(s.gate, s.outcome, s.reason, s.channel, s.detail) for s in planned.decisions]
        assert decisions_of("wes", request_id) == expected
        assert [c for c, _, _ in deliveries_of("wes", request_id)] == [
            c for c, _ in planned.channels
        ]
    finally:
        clock.close()
    if outcome == "suppress":
        assert expected == [
            ("weekday_only", "suppress", "weekend", None, "Saturday in Europe/Berlin")
        ]
    else:
        assert planned.channels != ()


@dataclass(frozen=True)
class AlwaysTaken:
    """A toy gate with an atomic claim of its own (like the window, caps and collapse): its plan
    step asks for the claim, and the claim always finds that another worker took it first."""

    name: str = "always_taken"

    def plan(self, p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
        return asked(with_step(p, self.name, "allow", "claim_asked"), self.name), channels

    def needed(self, p: Plan) -> bool:
        return self.name in p.asks

    def claim(self, conn: Connection, p: Plan, c: ClaimContext) -> Plan:
        assert conn.in_nested_transaction(), "a claim runs inside the route's savepoint"
        return replace(with_step(p, self.name, "suppress", "claim_lost"), channels=())


def test_a_registered_claim_is_made_when_only_its_own_plan_asks_for_it(weekday_gate) -> None:
    """No window, cap or collapse is planned for a receipt: the route still makes the new gate's
    claim, and the plan its loss gives is what the route records."""
    toy = AlwaysTaken()
    register(toy, claim=toy)
    try:
        clock = VirtualClock(MONDAY)
        try:
            register_recipient("tia", timezone="Europe/Berlin")
            planned = preview("tia", "receipt", event_id="e-claim", variables={"order": "A-2"})
            assert planned.outcome == "deliver" and "always_taken" in planned.asks
            assert (planned.window_until, planned.caps, planned.collapse) == (None, (), None)
            sent = notify("tia", "receipt", event_id="e-claim", variables={"order": "A-2"})
            assert route(["tia"], [sent.request_id]) == 1
        finally:
            clock.close()
    finally:
        unregister("always_taken")
    assert decisions_of("tia", sent.request_id) == [
        ("always_taken", "suppress", "claim_lost", None, "")
    ]
    assert deliveries_of("tia", sent.request_id) == []
    assert weekday_gate.arrivals.total == 0
