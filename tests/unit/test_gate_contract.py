"""gates.pipeline's contract: a gate is one module and one registration line (a toy gate here)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from clarion.catalog import Catalog
from clarion.catalog.model import Policy
from clarion.gates.contract import FunctionClaim, Snapshot
from clarion.gates.pipeline import CLAIMS, GATES, PARTS, plan, register, unregister
from tests.support.records import recipient, request
from tests.support.weekday_gate import GATE, WeekdayOnly

CATALOG = Catalog.from_dict(
    {
        "types": {
            "tip": {
                "category": "alert",
                "channels": ["email"],
                "templates": [{"version": 1, "body": "hello"}],
            }
        }
    }
)
SATURDAY = datetime(2026, 6, 13, 12, 0, tzinfo=UTC)
MONDAY = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


@pytest.fixture
def weekday_gate() -> Iterator[None]:
    register(WeekdayOnly(), before="quiet_hours")
    try:
        yield
    finally:
        unregister("weekday_only")


def _plan(now: datetime, zone: str = "UTC", parts: dict[str, object] | None = None):
    who = recipient(timezone=zone, addresses={"email": "a@example.com"})
    return plan(
        request("tip"),
        CATALOG.get("tip"),
        Snapshot(who, parts=parts or {}),
        now=now,
        policy=Policy(),
        needs_address={"email": True},
    )


def test_a_registered_gate_runs_in_its_place(weekday_gate: None) -> None:
    names = [g.name for g in GATES]
    assert names[names.index("weekday_only") + 1] == "quiet_hours"
    saturday = _plan(SATURDAY)
    assert saturday.outcome == "suppress" and saturday.channels == ()
    assert [(s.gate, s.reason, s.detail) for s in saturday.decisions] == [
        ("weekday_only", "weekend", "Saturday in UTC")
    ]
    monday = _plan(MONDAY)
    assert monday.outcome == "deliver"
    assert [s.gate for s in monday.steps if s.channel is None][:2] == [
        "weekday_only",
        "quiet_hours",
    ]


def test_the_gate_reads_the_recipients_own_day(weekday_gate: None) -> None:
    """Saturday 12:00 UTC is still Saturday in Auckland (Sunday 00:00) — and Friday nowhere
    near; Monday 00:30 in Auckland is Sunday in UTC, so the zone decides."""
    assert _plan(datetime(2026, 6, 14, 12, 30, tzinfo=UTC), "Pacific/Auckland").outcome == "deliver"
    assert _plan(datetime(2026, 6, 14, 12, 30, tzinfo=UTC), "UTC").outcome == "suppress"


def test_without_the_registration_line_the_gate_is_not_there() -> None:
    assert "weekday_only" not in [g.name for g in GATES]
    assert _plan(SATURDAY).outcome == "deliver"


def test_a_gate_name_is_registered_once(weekday_gate: None) -> None:
    with pytest.raises(ValueError, match="'weekday_only' is already registered"):
        register(WeekdayOnly())


def test_claims_run_window_then_collapse_then_caps() -> None:
    """Not the planning order (caps before collapse): a follower must spend no cap."""
    assert [c.name for c in CLAIMS] == ["activation_window", "collapse", "fatigue_cap"]
    names = [g.name for g in GATES]
    assert names.index("fatigue_cap") < names.index("collapse")


def test_a_gate_with_a_claim_registers_both_in_one_line() -> None:
    claim = FunctionClaim("weekday_only", lambda conn, p, c: p)
    register(WeekdayOnly(), before="quiet_hours", claim=claim, claim_before="collapse")
    try:
        assert [c.name for c in CLAIMS] == [
            "activation_window",
            "weekday_only",
            "collapse",
            "fatigue_cap",
        ]
    finally:
        unregister("weekday_only")
    assert "weekday_only" not in [c.name for c in CLAIMS] + [g.name for g in GATES]


@pytest.mark.parametrize(
    ("deliveries", "outcome", "reason"),
    [(0, "deliver", "first_contact"), (1, "suppress", "weekend"), (None, "suppress", "weekend")],
)
def test_the_gate_reads_its_own_part_of_the_snapshot(weekday_gate, deliveries, outcome, reason):
    """Its share of the snapshot, by its name: a recipient never contacted goes out on Saturday;
    one contacted before, or a snapshot read without the part, does not."""
    parts = {} if deliveries is None else {"weekday_only": deliveries}
    saturday = _plan(SATURDAY, parts=parts)
    assert saturday.outcome == outcome
    assert [s.reason for s in saturday.steps if s.gate == "weekday_only"] == [reason]


def test_a_gate_with_its_own_snapshot_registers_it_in_the_same_line() -> None:
    register(GATE, before="quiet_hours", snapshot=GATE)
    try:
        assert [p.name for p in PARTS] == ["weekday_only"]
        with pytest.raises(ValueError, match="'weekday_only' is already registered"):
            register(WeekdayOnly(name="weekday_twice"), snapshot=GATE)
        assert "weekday_twice" not in [g.name for g in GATES]  # refused whole, not half-added
    finally:
        unregister("weekday_only")
    assert PARTS == [] and "weekday_only" not in [g.name for g in GATES]
