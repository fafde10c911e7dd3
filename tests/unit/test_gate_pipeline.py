"""gates/pipeline.py: plan() over a Snapshot, gate by gate, with no database and no clock.

Per channel: reachability -> suppression list -> preferences -> one platform; per request:
quiet hours -> marketing SMS hours -> activation window -> fatigue caps -> collapse.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from clarion.catalog import Catalog
from clarion.catalog.model import Policy
from clarion.gates.activation_window import blocked_by_window
from clarion.gates.collapse import collapsed
from clarion.gates.contract import CapClaim, Fold, Plan, Snapshot, Step
from clarion.gates.fatigue_caps import cap_buckets, folded
from clarion.gates.pipeline import plan
from clarion.rows import Preference, Recipient
from tests.support.plans import (
    CAPPED,
    CAPPED_NO_SUMMARY,
    CATALOG,
    NEEDS_ADDRESS,
    NO_POLICY,
    NOW,
    ORG_CAPPED,
    recipient,
    run,
    type_spec,
    user_cap,
)
from tests.support.records import group, window
from tests.support.records import request as fake_request


def why(p: Plan) -> list[tuple[str, str, str, str | None]]:
    return [(s.gate, s.outcome, s.reason, s.channel) for s in p.decisions]


def sent_on(p: Plan) -> list[str]:
    return [c for c, _ in p.channels]


# --- catalog and recipient ------------------------------------------------------------------


def test_unknown_type_is_suppressed_with_its_name() -> None:
    request = fake_request("nope", id=1)
    p = plan(
        request, None, Snapshot(recipient()), now=NOW, policy=NO_POLICY, needs_address=NEEDS_ADDRESS
    )
    assert p.steps == (
        Step("catalog", "suppress", "unknown_type", "type 'nope' is not in the catalog"),
    )
    assert (p.outcome, p.channels) == ("suppress", ())


def test_unknown_recipient_is_suppressed() -> None:
    request = fake_request("receipt", id=1)
    p = plan(
        request,
        CATALOG.get("receipt"),
        Snapshot(None),
        now=NOW,
        policy=NO_POLICY,
        needs_address=NEEDS_ADDRESS,
    )
    assert p.steps == (Step("recipient", "suppress", "unknown_recipient"),)
    assert (p.outcome, p.channels) == ("suppress", ())


# --- per-channel gates ----------------------------------------------------------------------

SUPPRESS = "suppress"
NO_CHANNEL = ("channels", SUPPRESS, "no_channel", None)


@pytest.mark.parametrize(
    ("type_key", "who", "snapshot", "channels", "decisions"),
    [
        pytest.param("comment", recipient(), {}, ["email", "sms"], [], id="both-channels"),
        pytest.param(
            "pushy",
            recipient(),
            {},
            ["email"],
            [("channel", SUPPRESS, "no_adapter", "push")],
            id="no-adapter",
        ),
        pytest.param(
            "comment",
            recipient(addresses={"email": "a@example.com"}),
            {},
            ["email"],
            [("channel", SUPPRESS, "no_address", "sms")],
            id="needs-address-without-one",
        ),
        pytest.param(
            "comment",
            recipient(addresses={"email": "a@example.com", "sms": ""}),
            {},
            ["email"],
            [("channel", SUPPRESS, "no_address", "sms")],
            id="empty-address",
        ),
        pytest.param(
            "comment",
            recipient(addresses=None),
            {},
            [],
            [
                ("channel", SUPPRESS, "no_address", "email"),
                ("channel", SUPPRESS, "no_address", "sms"),
                NO_CHANNEL,
            ],
            id="no-addresses-at-all",
        ),
        pytest.param(
            "comment",
            recipient(),
            {"suppressed": {("email", "a@example.com"): "hard_bounce"}},
            ["sms"],
            [("suppression", SUPPRESS, "suppressed_address", "email")],
            id="suppressed-email",
        ),
        pytest.param(
            "comment",
            recipient(),
            {"suppressed": {("email", "old@example.com"): "hard_bounce"}},
            ["email", "sms"],
            [],
            id="other-address-suppressed",
        ),
        pytest.param(
            "comment",
            recipient(),
            {"suppressed": {("sms", "a@example.com"): "stop"}},
            ["email", "sms"],
            [],
            id="same-address-other-channel",
        ),
        pytest.param(
            "receipt",
            recipient(),
            {"suppressed": {("email", "a@example.com"): "complaint"}},
            [],
            [("suppression", SUPPRESS, "suppressed_address", "email"), NO_CHANNEL],
            id="suppression-applies-to-transactional",
        ),
        pytest.param(
            "chat_nudge",
            recipient(),
            {"suppressed": {("slack", "u1"): "uninstalled"}},
            ["teams"],
            [("suppression", SUPPRESS, "suppressed_address", "slack")],
            id="addressless-channel-keyed-by-user-id",
        ),
        pytest.param(
            "chat_nudge",
            recipient(),
            {"suppressed": {("slack", "u2"): "uninstalled"}},
            ["slack"],
            [("one_platform", SUPPRESS, "other_platform", "teams")],
            id="another-users-suppression",
        ),
        pytest.param(
            "comment",
            recipient(),
            {"preferences": (Preference("type", "comment", "email", False),)},
            ["sms"],
            [("preferences", SUPPRESS, "opted_out", "email")],
            id="opted-out-email",
        ),
        pytest.param(
            "comment",
            recipient(),
            {"preferences": (Preference("all", "*", "*", False),)},
            [],
            [
                ("preferences", SUPPRESS, "opted_out", "email"),
                ("preferences", SUPPRESS, "opted_out", "sms"),
                NO_CHANNEL,
            ],
            id="unsubscribe-all",
        ),
        pytest.param(
            "receipt",
            recipient(),
            {"preferences": (Preference("all", "*", "*", False),)},
            ["email"],
            [],
            id="transactional-ignores-unsubscribe-all",
        ),
        pytest.param(
            "login_alert",
            recipient(),
            {
                "preferences": (
                    Preference("all", "*", "*", False),
                    Preference("category", "security", "*", False),
                )
            },
            ["email"],
            [],
            id="security-ignores-unsubscribe-all",
        ),
        pytest.param(
            "chat_nudge",
            recipient(),
            {},
            ["slack"],
            [("one_platform", SUPPRESS, "other_platform", "teams")],
            id="one-platform-first",
        ),
        pytest.param(
            "chat_nudge",
            recipient(),
            {"preferences": (Preference("type", "chat_nudge", "slack", False),)},
            ["teams"],
            [("preferences", SUPPRESS, "opted_out", "slack")],
            id="one-platform-first-allowed",
        ),
        pytest.param("promo", recipient(country="US"), {}, ["email", "sms"], [], id="marketing-us"),
        pytest.param(
            "promo",
            recipient(timezone="America/New_York", country=None),
            {},
            ["email", "sms"],
            [],
            id="marketing-us-from-zone",
        ),
        pytest.param(
            "promo",
            recipient(timezone="America/New_York", country="DE"),
            {},
            [],
            [
                ("preferences", SUPPRESS, "opted_out", "email"),
                ("preferences", SUPPRESS, "opted_out", "sms"),
                NO_CHANNEL,
            ],
            id="marketing-explicit-country-beats-zone",
        ),
        pytest.param(
            "promo",
            recipient(timezone="Europe/Berlin"),
            {},
            [],
            [
                ("preferences", SUPPRESS, "opted_out", "email"),
                ("preferences", SUPPRESS, "opted_out", "sms"),
                NO_CHANNEL,
            ],
            id="marketing-de-from-zone",
        ),
        pytest.param(
            "promo",
            recipient(),
            {},
            [],
            [
                ("preferences", SUPPRESS, "opted_out", "email"),
                ("preferences", SUPPRESS, "opted_out", "sms"),
                NO_CHANNEL,
            ],
            id="marketing-unknown-country",
        ),
    ],
)
def test_channel_gates(
    type_key: str,
    who: Recipient,
    snapshot: dict[str, Any],
    channels: list[str],
    decisions: list[tuple],
) -> None:
    p = run(type_key, who=who, **snapshot)
    assert sent_on(p) == channels
    assert why(p) == decisions
    assert p.outcome == ("deliver" if channels else "suppress")


def test_suppressed_address_names_the_list_reason() -> None:
    p = run("comment", suppressed={("email", "a@example.com"): "hard_bounce"})
    (step,) = p.decisions
    assert "hard_bounce" in step.detail


@pytest.mark.parametrize(
    ("type_key", "who", "prefs", "channel", "detail"),
    [
        pytest.param(
            "comment",
            recipient(),
            (Preference("type", "comment", "sms", False),),
            "sms",
            "recipient setting: type comment on sms",
            id="type-setting",
        ),
        pytest.param(
            "comment",
            recipient(),
            (Preference("category", "alert", "*", False),),
            "email",
            "recipient setting: category alert on every channel",
            id="category-setting",
        ),
        pytest.param(
            "comment",
            recipient(),
            (Preference("all", "*", "email", False),),
            "email",
            "recipient setting: all notifications on email",
            id="all-setting",
        ),
        pytest.param(
            "promo",
            recipient(country="GB"),
            (),
            "email",
            "category default (marketing is opt-in in GB)",
            id="marketing-default",
        ),
    ],
)
def test_opt_out_is_recorded_with_the_deciding_rule(
    type_key: str, who: Recipient, prefs: tuple, channel: str, detail: str
) -> None:
    p = run(type_key, who=who, preferences=prefs)
    assert Step("preferences", "suppress", "opted_out", detail, channel) in p.decisions


def test_allowed_channels_carry_the_deciding_rule_too() -> None:
    p = run("receipt", preferences=(Preference("all", "*", "*", False),))
    assert Step("preferences", "allow", "allowed", "locked (transactional)", "email") in p.steps
    assert p.decisions == ()


# --- quiet hours ----------------------------------------------------------------------------

LA_NIGHT = recipient(timezone="America/Los_Angeles", quiet_start=time(22, 0), quiet_end=time(7, 0))
LA_23H = datetime(2026, 6, 15, 6, 0, tzinfo=UTC)  # 23:00 PDT on the 14th
LA_07H = datetime(2026, 6, 15, 14, 0, tzinfo=UTC)  # 07:00 PDT on the 15th


@pytest.mark.parametrize(
    ("type_key", "policy", "now", "outcome", "reason"),
    [
        pytest.param("comment", NO_POLICY, LA_23H, "defer", "quiet_hours", id="alert-deferred"),
        pytest.param(
            "receipt",
            NO_POLICY,
            LA_23H,
            "defer",
            "quiet_hours",
            id="transactional-not-on-default-bypass-list",
        ),
        pytest.param("nudge", NO_POLICY, LA_23H, "defer", "quiet_hours", id="activation-deferred"),
        pytest.param("login_alert", NO_POLICY, LA_23H, "deliver", "bypass", id="security-bypasses"),
        pytest.param("incident", NO_POLICY, LA_23H, "deliver", "bypass", id="critical-bypasses"),
        pytest.param(
            "receipt",
            Policy(quiet_hours_bypass=("transactional", "security")),
            LA_23H,
            "deliver",
            "bypass",
            id="policy-bypass-list",
        ),
        pytest.param(
            "login_alert",
            Policy(quiet_hours_bypass=()),
            LA_23H,
            "defer",
            "quiet_hours",
            id="empty-bypass-list",
        ),
        pytest.param(
            "comment",
            NO_POLICY,
            LA_07H,
            "deliver",
            "outside_quiet_hours",
            id="window-end-is-not-quiet",
        ),
        pytest.param(
            "comment",
            NO_POLICY,
            LA_07H - timedelta(minutes=1),
            "defer",
            "quiet_hours",
            id="last-minute-is-quiet",
        ),
    ],
)
def test_quiet_hours(
    type_key: str, policy: Policy, now: datetime, outcome: str, reason: str
) -> None:
    p = run(type_key, who=LA_NIGHT, policy=policy, now=now)
    assert p.outcome == outcome
    (step,) = [s for s in p.steps if s.gate == "quiet_hours"]
    assert step.reason == reason
    if outcome == "defer":
        assert p.defer_until == LA_07H
        assert p.channels == ()
        assert step == Step(
            "quiet_hours",
            "defer",
            "quiet_hours",
            "quiet hours in America/Los_Angeles until 2026-06-15T07:00:00-07:00",
            None,
            LA_07H,
        )
        assert why(p) == [("quiet_hours", "defer", "quiet_hours", None)]
    else:
        assert step.outcome == "allow"
        assert sent_on(p) == list(CATALOG.types[type_key].channels)


def test_quiet_hours_defer_plans_no_claims() -> None:
    """A deferred request is planned again later; it must not claim a window, cap or group now."""
    p = run("nudge", who=LA_NIGHT, now=LA_23H, policy=CAPPED)
    assert (p.outcome, p.window_until, p.caps, p.collapse) == ("defer", None, (), None)
    assert [s.gate for s in p.steps][-1] == "quiet_hours"


def test_quiet_hours_defer_is_after_now_in_the_repeated_autumn_hour_ok_first_pass() -> None:
    who = recipient(timezone="America/New_York", quiet_start=time(0, 0), quiet_end=time(1, 30))
    now = datetime(2026, 11, 1, 5, 10, tzinfo=UTC)  # 01:10 EDT, first pass
    p = run("comment", who=who, now=now)
    assert p.outcome == "defer" and p.defer_until is not None
    # astimezone: == between zones is always False for an ambiguous wall time (PEP 495)
    assert p.defer_until.astimezone(UTC) == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)


def test_quiet_hours_defer_is_after_now_in_the_repeated_autumn_hour_second_pass() -> None:
    who = recipient(timezone="America/New_York", quiet_start=time(0, 0), quiet_end=time(1, 30))
    now = datetime(2026, 11, 1, 6, 10, tzinfo=UTC)  # 01:10 EST, second pass
    p = run("comment", who=who, now=now)
    assert p.outcome == "defer" and p.defer_until is not None
    assert p.defer_until.astimezone(UTC) == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)


# --- marketing SMS hours (08:00-21:00 local) ------------------------------------------------

NY_US = recipient(timezone="America/New_York", country="US")


def ny(wall: str) -> datetime:
    return datetime.fromisoformat(wall).replace(tzinfo=ZoneInfo("America/New_York"))


@pytest.mark.parametrize(
    ("type_key", "who", "now", "channels"),
    [
        pytest.param(
            "promo",
            NY_US,
            ny("2026-06-14 22:00"),
            [("email", None), ("sms", ny("2026-06-15 08:00"))],
            id="late-evening-sms-held",
        ),
        pytest.param(
            "promo",
            NY_US,
            ny("2026-06-15 07:59"),
            [("email", None), ("sms", ny("2026-06-15 08:00"))],
            id="early-morning-sms-held",
        ),
        pytest.param(
            "promo",
            NY_US,
            ny("2026-06-15 21:00"),
            [("email", None), ("sms", ny("2026-06-16 08:00"))],
            id="at-closing-sms-held",
        ),
        pytest.param(
            "promo",
            NY_US,
            ny("2026-06-15 08:00"),
            [("email", None), ("sms", None)],
            id="at-opening-sms-goes",
        ),
        pytest.param(
            "promo",
            NY_US,
            ny("2026-06-15 20:59"),
            [("email", None), ("sms", None)],
            id="before-closing-sms-goes",
        ),
        pytest.param(
            "promo",
            replace(NY_US, addresses={"email": "a@example.com"}),
            ny("2026-06-14 22:00"),
            [("email", None)],
            id="no-sms-channel-no-hold",
        ),
        pytest.param(
            "comment",
            NY_US,
            ny("2026-06-14 22:00"),
            [("email", None), ("sms", None)],
            id="not-marketing-no-hold",
        ),
    ],
)
def test_marketing_sms_hours(
    type_key: str, who: Recipient, now: datetime, channels: list[tuple[str, datetime | None]]
) -> None:
    p = run(type_key, who=who, now=now)
    assert p.outcome == "deliver"
    assert list(p.channels) == channels
    assert p.defer_until is None
    held = [nb for c, nb in channels if c == "sms" and nb is not None]
    sms_steps = [s for s in p.decisions if s.gate == "sms_hours"]
    if held:
        assert [(s.outcome, s.reason, s.channel, s.until) for s in sms_steps] == [
            ("defer", "marketing_sms_hours", "sms", held[0])
        ]
    else:
        assert sms_steps == []


def test_marketing_sms_hours_use_the_policy() -> None:
    p = run(
        "promo",
        who=NY_US,
        now=ny("2026-06-15 09:30"),
        policy=Policy(marketing_sms_hours=("10:00", "18:00")),
    )
    assert list(p.channels) == [("email", None), ("sms", ny("2026-06-15 10:00"))]


def test_marketing_sms_only_channel_is_held_not_deferred() -> None:
    p = run("promo", who=replace(NY_US, addresses={"sms": "+15550100"}), now=ny("2026-06-14 22:00"))
    assert (p.outcome, list(p.channels)) == ("deliver", [("sms", ny("2026-06-15 08:00"))])


# --- activation window -----------------------------------------------------------------------

OPEN = window(NOW + timedelta(hours=5), "chat_nudge")


@pytest.mark.parametrize(
    ("type_key", "window", "policy", "outcome", "window_until", "defer_until"),
    [
        pytest.param("nudge", OPEN, NO_POLICY, "suppress", None, None, id="open-window-skips"),
        pytest.param(
            "nudge_defer", OPEN, NO_POLICY, "defer", None, OPEN.until, id="open-window-defers"
        ),
        pytest.param(
            "chat_nudge", OPEN, NO_POLICY, "suppress", None, None, id="opener-type-also-blocked"
        ),
        pytest.param("welcome", OPEN, NO_POLICY, "deliver", None, None, id="exempt-not-blocked"),
        pytest.param(
            "welcome", None, NO_POLICY, "deliver", None, None, id="exempt-opens-no-window"
        ),
        pytest.param(
            "nudge",
            None,
            NO_POLICY,
            "deliver",
            NOW + timedelta(hours=48),
            None,
            id="no-window-opens-one",
        ),
        pytest.param(
            "nudge",
            None,
            Policy(activation_window_hours=24),
            "deliver",
            NOW + timedelta(hours=24),
            None,
            id="window-length-from-policy",
        ),
        pytest.param(
            "nudge_defer",
            None,
            NO_POLICY,
            "deliver",
            NOW + timedelta(hours=48),
            None,
            id="defer-type-opens-one",
        ),
        pytest.param(
            "nudge",
            window(NOW, "chat_nudge"),
            NO_POLICY,
            "deliver",
            NOW + timedelta(hours=48),
            None,
            id="window-ending-now-is-closed",
        ),
        pytest.param(
            "nudge",
            window(NOW - timedelta(hours=1), "chat_nudge"),
            NO_POLICY,
            "deliver",
            NOW + timedelta(hours=48),
            None,
            id="expired-window",
        ),
        pytest.param(
            "nudge",
            window(NOW + timedelta(seconds=1), "chat_nudge"),
            NO_POLICY,
            "suppress",
            None,
            None,
            id="window-ending-in-a-second-is-open",
        ),
        pytest.param("comment", OPEN, NO_POLICY, "deliver", None, None, id="alert-ignores-window"),
        pytest.param(
            "receipt", OPEN, NO_POLICY, "deliver", None, None, id="transactional-ignores-window"
        ),
        pytest.param(
            "promo", OPEN, NO_POLICY, "deliver", None, None, id="marketing-ignores-window"
        ),
    ],
)
def test_activation_window(
    type_key: str,
    window: tuple[datetime, str] | None,
    policy: Policy,
    outcome: str,
    window_until: datetime | None,
    defer_until: datetime | None,
) -> None:
    p = run(type_key, window=window, policy=policy, who=recipient(country="US"))
    assert (p.outcome, p.window_until, p.defer_until) == (outcome, window_until, defer_until)
    steps = [s for s in p.steps if s.gate == "activation_window"]
    if outcome == "deliver":
        assert p.decisions == ()
        if CATALOG.types[type_key].category != "activation":
            assert steps == []
        else:
            assert [s.reason for s in steps] == [
                "exempt" if window_until is None else "opens_window"
            ]
    else:
        last = p.decisions[-1]
        assert (last.gate, last.outcome, last.reason, last.channel) == (
            "activation_window",
            outcome,
            "activation_window",
            None,
        )
        assert "chat_nudge" in last.detail
        assert last.until == defer_until
        assert [s.gate for s in p.decisions].count("activation_window") == 1


# --- fatigue caps ---------------------------------------------------------------------------

AKL = recipient(timezone="Pacific/Auckland")  # NOW is 2026-06-16 00:00 NZST there
LA = recipient(timezone="America/Los_Angeles")  # NOW is 2026-06-15 05:00 PDT there
UTC_DAY_END = datetime(2026, 6, 16, tzinfo=UTC)
AKL_DAY_END = datetime(2026, 6, 17, tzinfo=ZoneInfo("Pacific/Auckland"))  # 2026-06-16T12:00Z
LA_DAY_END = datetime(2026, 6, 16, tzinfo=ZoneInfo("America/Los_Angeles"))  # 2026-06-16T07:00Z


@pytest.mark.parametrize(
    ("type_key", "who", "counters", "policy", "outcome", "caps", "fold"),
    [
        pytest.param(
            "comment",
            recipient(),
            {},
            CAPPED,
            "deliver",
            (CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),),
            None,
            id="first-of-the-day",
        ),
        pytest.param(
            "comment",
            recipient(),
            user_cap(2),
            CAPPED,
            "deliver",
            (CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),),
            None,
            id="under-cap",
        ),
        pytest.param(
            "comment",
            recipient(),
            user_cap(3),
            CAPPED,
            "fold",
            (),
            Fold("daily_summary", "summary:2026-06-15", UTC_DAY_END),
            id="at-cap-folds",
        ),
        pytest.param(
            "comment",
            recipient(),
            user_cap(9),
            CAPPED,
            "fold",
            (),
            Fold("daily_summary", "summary:2026-06-15", UTC_DAY_END),
            id="over-cap-folds",
        ),
        pytest.param(
            "comment",
            recipient(),
            user_cap(3),
            CAPPED_NO_SUMMARY,
            "suppress",
            (),
            None,
            id="at-cap-without-summary-suppressed",
        ),
        pytest.param(
            "comment",
            recipient(),
            user_cap(3, user="u2"),
            CAPPED,
            "deliver",
            (CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),),
            None,
            id="other-users-counter",
        ),
        pytest.param(
            "comment",
            recipient(),
            user_cap(3, day="2026-06-14"),
            CAPPED,
            "deliver",
            (CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),),
            None,
            id="yesterdays-counter",
        ),
        pytest.param(
            "receipt",
            recipient(),
            user_cap(3),
            CAPPED,
            "deliver",
            (),
            None,
            id="transactional-not-capped",
        ),
        pytest.param(
            "login_alert",
            recipient(),
            user_cap(3),
            CAPPED,
            "deliver",
            (),
            None,
            id="security-not-capped",
        ),
        pytest.param(
            "incident",
            recipient(),
            user_cap(3),
            CAPPED,
            "deliver",
            (),
            None,
            id="critical-not-capped",
        ),
        pytest.param(
            "daily_summary",
            recipient(),
            user_cap(3),
            CAPPED,
            "deliver",
            (),
            None,
            id="summary-type-not-capped",
        ),
        pytest.param(
            "comment", recipient(), user_cap(3), NO_POLICY, "deliver", (), None, id="no-caps"
        ),
        # the user's bucket is the recipient's local day
        pytest.param(
            "comment",
            AKL,
            user_cap(3, day="2026-06-15"),
            CAPPED,
            "deliver",
            (CapClaim("user:u1", "2026-06-16", 3, AKL_DAY_END),),
            None,
            id="auckland-utc-date-counter-ignored",
        ),
        pytest.param(
            "comment",
            AKL,
            user_cap(3, day="2026-06-16"),
            CAPPED,
            "fold",
            (),
            Fold("daily_summary", "summary:2026-06-16", AKL_DAY_END),
            id="auckland-local-date",
        ),
        pytest.param(
            "comment",
            LA,
            user_cap(2, day="2026-06-15"),
            CAPPED,
            "deliver",
            (CapClaim("user:u1", "2026-06-15", 3, LA_DAY_END),),
            None,
            id="los-angeles-under-cap",
        ),
        pytest.param(
            "comment",
            LA,
            user_cap(3, day="2026-06-15"),
            CAPPED,
            "fold",
            (),
            Fold("daily_summary", "summary:2026-06-15", LA_DAY_END),
            id="los-angeles-fold-due-at-local-midnight",
        ),
        # the organisation's bucket is the UTC hour
        pytest.param(
            "comment",
            recipient(org_id="acme"),
            {},
            ORG_CAPPED,
            "deliver",
            (
                CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),
                CapClaim("org:acme", "2026-06-15T12", 10, NOW + timedelta(hours=1)),
            ),
            None,
            id="org-under-cap",
        ),
        pytest.param(
            "comment",
            recipient(org_id="acme"),
            {("org:acme", "2026-06-15T12"): 10},
            ORG_CAPPED,
            "fold",
            (),
            Fold("daily_summary", "summary:2026-06-15", UTC_DAY_END),
            id="org-at-cap",
        ),
        pytest.param(
            "comment",
            recipient(org_id="acme"),
            {("org:acme", "2026-06-15T11"): 10},
            ORG_CAPPED,
            "deliver",
            (
                CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),
                CapClaim("org:acme", "2026-06-15T12", 10, NOW + timedelta(hours=1)),
            ),
            None,
            id="org-last-hour-ignored",
        ),
        pytest.param(
            "comment",
            replace(AKL, org_id="acme"),
            {("org:acme", "2026-06-15T12"): 10},
            ORG_CAPPED,
            "fold",
            (),
            Fold("daily_summary", "summary:2026-06-16", AKL_DAY_END),
            id="org-hour-is-utc-fold-is-local-day",
        ),
        pytest.param(
            "comment",
            recipient(org_id="acme"),
            {},
            Policy(per_org_per_hour=10),
            "deliver",
            (CapClaim("org:acme", "2026-06-15T12", 10, NOW + timedelta(hours=1)),),
            None,
            id="org-cap-only",
        ),
        pytest.param(
            "comment",
            recipient(),
            {},
            Policy(per_org_per_hour=10),
            "deliver",
            (),
            None,
            id="org-cap-without-org",
        ),
    ],
)
def test_fatigue_caps(
    type_key: str,
    who: Recipient,
    counters: dict,
    policy: Policy,
    outcome: str,
    caps: tuple[CapClaim, ...],
    fold: Fold | None,
) -> None:
    p = run(type_key, who=who, counters=counters, policy=policy)
    assert (p.outcome, p.caps, p.fold) == (outcome, caps, fold)
    if outcome == "deliver":
        assert p.decisions == ()
    else:
        assert why(p) == [("fatigue_cap", outcome, "fatigue_cap", None)]


def test_fatigue_cap_detail_names_the_bucket() -> None:
    p = run("comment", who=AKL, counters=user_cap(3, day="2026-06-16"), policy=CAPPED)
    assert p.decisions[0].detail.startswith("user:u1 reached 3 in 2026-06-16")
    assert "summary" in p.decisions[0].detail


def test_capped_activation_nudge_claims_no_window() -> None:
    p = run("nudge", counters=user_cap(3), policy=CAPPED)
    assert (p.outcome, p.window_until) == ("fold", None)


def test_under_cap_activation_nudge_claims_window_and_cap() -> None:
    p = run("nudge", counters=user_cap(1), policy=CAPPED)
    assert p.outcome == "deliver"
    assert p.window_until == NOW + timedelta(hours=48)
    assert p.caps == (CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),)


@pytest.mark.parametrize(
    ("who", "now", "expected"),
    [
        pytest.param(recipient(), NOW, [("user:u1", "2026-06-15", UTC_DAY_END)], id="utc"),
        pytest.param(AKL, NOW, [("user:u1", "2026-06-16", AKL_DAY_END)], id="auckland-ahead"),
        pytest.param(
            LA,
            datetime(2026, 6, 15, 3, 0, tzinfo=UTC),
            [("user:u1", "2026-06-14", datetime(2026, 6, 15, 7, tzinfo=UTC))],
            id="los-angeles-behind",
        ),
        pytest.param(
            recipient(timezone="Asia/Kolkata", org_id="acme"),
            datetime(2026, 6, 15, 18, 45, tzinfo=UTC),
            [
                ("user:u1", "2026-06-16", datetime(2026, 6, 16, 18, 30, tzinfo=UTC)),
                ("org:acme", "2026-06-15T18", datetime(2026, 6, 15, 19, tzinfo=UTC)),
            ],
            id="kolkata-with-org",
        ),
        pytest.param(
            recipient(timezone="America/New_York", user_id="u9"),
            datetime(2026, 3, 8, 12, 0, tzinfo=UTC),
            [("user:u9", "2026-03-08", datetime(2026, 3, 9, 4, tzinfo=UTC))],
            id="new-york-spring-day",
        ),
    ],
)
def test_cap_buckets(who: Recipient, now: datetime, expected: list) -> None:
    got = cap_buckets(who, now)
    assert [(scope, bucket) for scope, bucket, _ in got] == [(s, b) for s, b, _ in expected]
    assert [ends for _, _, ends in got] == [ends for _, _, ends in expected]
    assert all(ends > now for _, _, ends in got)


# --- collapse -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_key", "variables", "collapses", "outcome", "collapse"),
    [
        pytest.param(
            "mention",
            {"thread": 42},
            {},
            "deliver",
            ("thread-42", NOW + timedelta(seconds=300)),
            id="first-leads",
        ),
        pytest.param(
            "mention",
            {"thread": 42},
            group("thread-42", 5, NOW + timedelta(seconds=100), 2),
            "collapse",
            None,
            id="second-within-window-collapses",
        ),
        pytest.param(
            "mention",
            {"thread": 42},
            group("thread-42", 5, NOW, 2),
            "deliver",
            ("thread-42", NOW + timedelta(seconds=300)),
            id="window-ending-now-leads-again",
        ),
        pytest.param(
            "mention",
            {"thread": 42},
            group("thread-42", 5, NOW - timedelta(minutes=1), 2),
            "deliver",
            ("thread-42", NOW + timedelta(seconds=300)),
            id="after-window-leads-again",
        ),
        pytest.param(
            "mention",
            {"thread": 42},
            group("thread-41", 5, NOW + timedelta(seconds=100), 2),
            "deliver",
            ("thread-42", NOW + timedelta(seconds=300)),
            id="other-key",
        ),
        pytest.param(
            "mention",
            {"thread": 42},
            group("thread-42", 7, NOW + timedelta(seconds=100), 1),
            "deliver",
            ("thread-42", NOW + timedelta(seconds=300)),
            id="leader-replanned",
        ),
        pytest.param(
            "reaction",
            {"post": "p1"},
            {},
            "deliver",
            ("p1", NOW + timedelta(seconds=120)),
            id="default-window-120s",
        ),
        pytest.param(
            "comment",
            {},
            group("thread-42", 5, NOW + timedelta(seconds=100), 2),
            "deliver",
            None,
            id="no-collapse-option",
        ),
    ],
)
def test_collapse(
    type_key: str,
    variables: dict,
    collapses: dict,
    outcome: str,
    collapse: tuple[str, datetime] | None,
) -> None:
    p = run(type_key, variables=variables, collapses=collapses, request_id=7)
    assert (p.outcome, p.collapse) == (outcome, collapse)
    if outcome == "collapse":
        assert why(p) == [("collapse", "collapse", "collapsed", None)]
        assert "request 5" in p.decisions[0].detail
        assert "3 so far" in p.decisions[0].detail
    else:
        assert p.decisions == ()


def test_collapsed_request_claims_no_cap() -> None:
    p = run(
        "mention",
        variables={"thread": 42},
        policy=CAPPED,
        counters=user_cap(1),
        collapses=group("thread-42", 5, NOW + timedelta(seconds=100), 2),
    )
    assert (p.outcome, p.caps, p.collapse, p.fold) == ("collapse", (), None, None)


def test_leader_claims_cap_and_group() -> None:
    p = run("mention", variables={"thread": 42}, policy=CAPPED, counters=user_cap(1))
    assert p.outcome == "deliver"
    assert p.caps == (CapClaim("user:u1", "2026-06-15", 3, UTC_DAY_END),)
    assert p.collapse == ("thread-42", NOW + timedelta(seconds=300))


# --- a claim lost to another worker (gates.apply turns the plan into the gate's own outcome) ---

LOST_WINDOW = window(NOW + timedelta(hours=2), "chat_nudge")


def _lost(name: str) -> tuple[Plan, Plan]:
    """A plan that would deliver (with its claims), and what it becomes when a claim is lost."""
    if name == "window-skip":
        p = run("nudge", policy=CAPPED)
        return p, blocked_by_window(p, LOST_WINDOW)
    if name == "window-defer":
        p = run("nudge_defer", policy=CAPPED)
        return p, blocked_by_window(p, LOST_WINDOW)
    if name == "cap-fold":
        p = run("nudge", policy=CAPPED, counters=user_cap(2))
        return p, folded(p, recipient(), NOW, CAPPED, "user:u1 reached 3 in 2026-06-15")
    if name == "cap-no-summary":
        p = run("nudge", policy=CAPPED_NO_SUMMARY, counters=user_cap(2))
        return p, folded(p, recipient(), NOW, CAPPED_NO_SUMMARY, "user:u1 reached 3 in 2026-06-15")
    p = run("mention", variables={"thread": 42}, policy=CAPPED)
    return p, collapsed(p, group("thread-42", 5, NOW + timedelta(seconds=60), 1)["thread-42"])


@pytest.mark.parametrize(
    ("name", "outcome", "defer_until", "fold"),
    [
        pytest.param("window-skip", "suppress", None, None, id="window-skip"),
        pytest.param("window-defer", "defer", LOST_WINDOW.until, None, id="window-defer"),
        pytest.param(
            "cap-fold",
            "fold",
            None,
            Fold("daily_summary", "summary:2026-06-15", UTC_DAY_END),
            id="cap-fold",
        ),
        pytest.param("cap-no-summary", "suppress", None, None, id="cap-no-summary"),
        pytest.param("collapse", "collapse", None, None, id="collapse"),
    ],
)
def test_lost_claim_turns_a_delivering_plan_into_the_gates_outcome(
    name: str, outcome: str, defer_until: datetime | None, fold: Fold | None
) -> None:
    planned, lost = _lost(name)
    assert planned.outcome == "deliver" and planned.caps != ()
    assert (lost.outcome, lost.channels, lost.defer_until, lost.fold) == (
        outcome,
        (),
        defer_until,
        fold,
    )
    assert (lost.window_until, lost.collapse) == (None, None)
    if not name.startswith("window"):  # the window is claimed first: no cap was claimed yet
        assert lost.caps == ()
    assert lost.steps[:-1] == planned.steps
    assert lost.decisions[-1].channel is None
    assert lost.decisions[-1].outcome == outcome


def test_lost_collapse_names_the_winner() -> None:
    _, lost = _lost("collapse")
    assert "request 5" in lost.decisions[-1].detail and "2 so far" in lost.decisions[-1].detail


# --- decisions and outcome ------------------------------------------------------------------


def test_decisions_are_exactly_the_non_allow_steps_in_order() -> None:
    catalog = Catalog.from_dict(
        {"types": {"blast": type_spec("marketing", ["push", "slack", "email", "sms"])}}
    )
    request = fake_request("blast", id=1)
    snap = Snapshot(NY_US, preferences=(Preference("type", "blast", "slack", False),))
    p = plan(
        request,
        catalog.get("blast"),
        snap,
        now=ny("2026-06-14 22:00"),
        policy=NO_POLICY,
        needs_address=NEEDS_ADDRESS,
    )
    assert [(s.gate, s.outcome, s.reason, s.channel) for s in p.steps] == [
        ("channel", "suppress", "no_adapter", "push"),
        ("preferences", "suppress", "opted_out", "slack"),
        ("preferences", "allow", "allowed", "email"),
        ("preferences", "allow", "allowed", "sms"),
        ("quiet_hours", "allow", "outside_quiet_hours", None),
        ("sms_hours", "defer", "marketing_sms_hours", "sms"),
    ]
    assert why(p) == [
        ("channel", "suppress", "no_adapter", "push"),
        ("preferences", "suppress", "opted_out", "slack"),
        ("sms_hours", "defer", "marketing_sms_hours", "sms"),
    ]
    assert p.outcome == "deliver"


def test_gate_order_for_a_delivered_activation_nudge() -> None:
    p = run("nudge", policy=CAPPED)
    assert [(s.gate, s.reason) for s in p.steps] == [
        ("preferences", "allowed"),
        ("quiet_hours", "outside_quiet_hours"),
        ("activation_window", "opens_window"),
        ("fatigue_cap", "under_cap"),
    ]
    assert p.decisions == ()


def _s(outcome: str, channel: str | None = None) -> Step:
    return Step("g", outcome, "r", channel=channel)


@pytest.mark.parametrize(
    ("p", "outcome"),
    [
        pytest.param(Plan(), "suppress", id="empty"),
        pytest.param(Plan(channels=(("email", None),)), "deliver", id="channels"),
        pytest.param(
            Plan(steps=(_s("suppress", "sms"),), channels=(("email", None),)),
            "deliver",
            id="channels-despite-channel-suppress",
        ),
        pytest.param(Plan(steps=(_s("allow"), _s("defer"))), "defer", id="defer"),
        pytest.param(Plan(steps=(_s("fold"),)), "fold", id="fold"),
        pytest.param(
            Plan(steps=(_s("collapse"), _s("allow"))), "collapse", id="collapse-then-allow"
        ),
        pytest.param(
            Plan(steps=(_s("suppress"), _s("defer"))), "defer", id="last-request-level-wins"
        ),
        pytest.param(
            Plan(steps=(_s("allow", "email"), _s("defer", "sms"))),
            "suppress",
            id="channel-level-defer-ignored",
        ),
        pytest.param(Plan(steps=(_s("allow"),)), "suppress", id="only-allows"),
    ],
)
def test_plan_outcome(p: Plan, outcome: str) -> None:
    assert p.outcome == outcome


def test_plan_does_not_touch_its_inputs() -> None:
    counters = user_cap(1)
    collapses = group("thread-42", 5, NOW - timedelta(minutes=1), 2)
    snap = Snapshot(recipient(), counters=counters, collapses=collapses)
    request = fake_request("mention", id=7, variables={"thread": 42})
    p = plan(
        request, CATALOG.get("mention"), snap, now=NOW, policy=CAPPED, needs_address=NEEDS_ADDRESS
    )
    assert p.collapse is not None and p.caps != ()
    assert counters == user_cap(1)
    assert collapses == group("thread-42", 5, NOW - timedelta(minutes=1), 2)
    assert request == fake_request("mention", id=7, variables={"thread": 42})
