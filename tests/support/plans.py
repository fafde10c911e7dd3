"""The gate planner's unit-test bench, shared by tests/unit/test_gate_pipeline.py and
test_collapse_rules.py: a catalog of types covering each gate, cap policies, a recipient built
from the real record, and `run`, which plans one request at a fixed NOW and checks what every plan
must hold."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from clarion.catalog import Catalog
from clarion.catalog.model import Policy
from clarion.gates.contract import Plan, Snapshot
from clarion.gates.pipeline import plan
from clarion.rows import Recipient
from tests.support.records import recipient as fake_recipient
from tests.support.records import request as fake_request

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)  # a Monday; 08:00 in New York, 00:00 in Auckland
NEEDS_ADDRESS = {"email": True, "sms": True, "slack": False, "teams": False}  # no "push" adapter


def type_spec(category: str, channels: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "category": category,
        "channels": channels,
        "templates": [{"version": 1, "body": "hello"}],
        **extra,
    }


CATALOG = Catalog.from_dict(
    {
        "types": {
            "receipt": type_spec("transactional", ["email"]),
            "login_alert": type_spec("security", ["email"]),
            "comment": type_spec("alert", ["email", "sms"]),
            "incident": type_spec("alert", ["email", "sms"], options={"critical": True}),
            "pushy": type_spec("alert", ["push", "email"]),
            "chat_nudge": type_spec("activation", ["slack", "teams"], one_platform=True),
            "nudge": type_spec("activation", ["email"]),
            "nudge_defer": type_spec("activation", ["email"], options={"on_window": "defer"}),
            "welcome": type_spec("activation", ["email"], options={"window_exempt": True}),
            "promo": type_spec("marketing", ["email", "sms"]),
            "mention": type_spec(
                "alert",
                ["email"],
                required=["thread"],
                options={"collapse": {"key": "thread-{{ thread }}", "window_seconds": 300}},
            ),
            "reaction": type_spec(
                "alert", ["email"], required=["post"], options={"collapse": {"key": "{{ post }}"}}
            ),
            "daily_summary": type_spec("digest", ["email"]),
        },
        "policy": {"fatigue": {"summary_type": "daily_summary"}},
    }
)
NO_POLICY = Policy()
CAPPED = Policy(per_user_per_day=3, summary_type="daily_summary")
CAPPED_NO_SUMMARY = Policy(per_user_per_day=3)
ORG_CAPPED = Policy(per_user_per_day=3, per_org_per_hour=10, summary_type="daily_summary")


def recipient(**overrides: Any) -> Recipient:
    addresses = {"email": "a@example.com", "sms": "+15550100"}
    return fake_recipient(**{"addresses": addresses, **overrides})


def run(
    type_key: str,
    *,
    policy: Policy = NO_POLICY,
    now: datetime = NOW,
    variables: dict[str, Any] | None = None,
    request_id: int = 7,
    who: Recipient | None = None,
    **snapshot: Any,
) -> Plan:
    request = fake_request(type_key, id=request_id, variables=variables)
    snap = Snapshot(recipient=recipient() if who is None else who, **snapshot)
    result = plan(
        request, CATALOG.get(type_key), snap, now=now, policy=policy, needs_address=NEEDS_ADDRESS
    )
    invariants(result, now)
    return result


def invariants(p: Plan, now: datetime) -> None:
    """What holds for every plan: a non-delivery names why; a defer says until when."""
    assert p.decisions == tuple(s for s in p.steps if s.outcome != "allow")
    if p.outcome != "deliver":
        assert p.channels == ()
        assert any(s.channel is None and s.outcome == p.outcome for s in p.decisions)
        assert p.caps == () and p.window_until is None and p.collapse is None
    if p.outcome == "defer":
        assert p.defer_until is not None and p.defer_until > now
    else:
        assert p.defer_until is None
    if p.outcome != "fold":
        assert p.fold is None


def user_cap(count: int, day: str = "2026-06-15", user: str = "u1") -> dict:
    return {(f"user:{user}", day): count}
