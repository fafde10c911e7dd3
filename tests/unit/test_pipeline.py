"""gates/pipeline.plan(): which channels a request goes to, and a recorded reason for every other one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from catalog import Catalog, NotificationType
from gates.pipeline import Plan, Verdict, plan

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
ADAPTERS = {"console": False, "webhook": False, "sms": True, "email": True}
REQUEST = {"type_key": "t", "user_id": "u-1", "occurrence_key": "event:1"}


def ntype(channels: list[str], one_platform: bool = False) -> NotificationType:
    return Catalog.from_dict(
        {
            "types": {
                "t": {
                    "category": "activation",
                    "channels": channels,
                    "one_platform": one_platform,
                    "templates": [{"version": 1, "body": "hi"}],
                }
            }
        }
    ).get("t")


def recipient(**addresses: str) -> dict[str, Any]:
    return {"user_id": "u-1", "timezone": "UTC", "addresses": addresses}


def test_unknown_type_is_suppressed_with_its_key() -> None:
    result = plan(
        {**REQUEST, "type_key": "gone"}, None, recipient(), now=NOW, needs_address=ADAPTERS
    )
    assert result == Plan(
        (), (Verdict("catalog", "suppress", "unknown_type", "type 'gone' is not in the catalog"),)
    )
    assert not result.delivers


@pytest.mark.parametrize("channels", [["webhook"], ["sms", "console"]])
def test_unknown_recipient_is_suppressed(channels: list[str]) -> None:
    result = plan(REQUEST, ntype(channels), None, now=NOW, needs_address=ADAPTERS)
    assert result == Plan((), (Verdict("recipient", "suppress", "unknown_recipient"),))
    assert not result.delivers


@pytest.mark.parametrize(
    ("channels", "one_platform", "person", "delivered", "verdicts"),
    [
        pytest.param(["webhook"], False, recipient(), ("webhook",), (), id="plain"),
        pytest.param(
            ["webhook", "console"], False, recipient(), ("webhook", "console"), (), id="fan-out"
        ),
        pytest.param(
            ["teams"],
            False,
            recipient(),
            (),
            (
                Verdict(
                    "channel", "suppress", "no_adapter", "no adapter for channel 'teams'", "teams"
                ),
            ),
            id="no-adapter",
        ),
        pytest.param(
            ["sms"],
            False,
            recipient(),
            (),
            (Verdict("channel", "suppress", "no_address", "recipient has no sms address", "sms"),),
            id="needs-address-missing",
        ),
        pytest.param(
            ["sms"],
            False,
            recipient(sms=""),
            (),
            (Verdict("channel", "suppress", "no_address", "recipient has no sms address", "sms"),),
            id="needs-address-empty",
        ),
        pytest.param(
            ["sms"],
            False,
            recipient(email="a@example.com"),
            (),
            (Verdict("channel", "suppress", "no_address", "recipient has no sms address", "sms"),),
            id="needs-address-other-channel-only",
        ),
        pytest.param(
            ["sms"], False, recipient(sms="+15550100"), ("sms",), (), id="needs-address-present"
        ),
        pytest.param(
            ["console"],
            False,
            {"user_id": "u-1", "addresses": None},
            ("console",),
            (),
            id="no-address-needed-null-addresses",
        ),
        pytest.param(
            ["teams", "sms", "email", "webhook"],
            False,
            recipient(email="a@example.com"),
            ("email", "webhook"),
            (
                Verdict(
                    "channel", "suppress", "no_adapter", "no adapter for channel 'teams'", "teams"
                ),
                Verdict("channel", "suppress", "no_address", "recipient has no sms address", "sms"),
            ),
            id="mixed",
        ),
        pytest.param(
            ["webhook", "console", "email"],
            True,
            recipient(email="a@example.com"),
            ("webhook",),
            (
                Verdict(
                    "one_platform",
                    "suppress",
                    "other_platform",
                    "sent on webhook instead",
                    "console",
                ),
                Verdict(
                    "one_platform", "suppress", "other_platform", "sent on webhook instead", "email"
                ),
            ),
            id="one-platform-keeps-first",
        ),
        pytest.param(
            ["teams", "sms", "console", "webhook"],
            True,
            recipient(),
            ("console",),
            (
                Verdict(
                    "channel", "suppress", "no_adapter", "no adapter for channel 'teams'", "teams"
                ),
                Verdict("channel", "suppress", "no_address", "recipient has no sms address", "sms"),
                Verdict(
                    "one_platform",
                    "suppress",
                    "other_platform",
                    "sent on console instead",
                    "webhook",
                ),
            ),
            id="one-platform-first-reachable",
        ),
        pytest.param(
            ["console", "sms"],
            True,
            recipient(),
            ("console",),
            (Verdict("channel", "suppress", "no_address", "recipient has no sms address", "sms"),),
            id="one-platform-unreachable-later-channel-says-why",
        ),
        pytest.param(
            ["teams", "sms"],
            True,
            recipient(),
            (),
            (
                Verdict(
                    "channel", "suppress", "no_adapter", "no adapter for channel 'teams'", "teams"
                ),
                Verdict("channel", "suppress", "no_address", "recipient has no sms address", "sms"),
            ),
            id="one-platform-nothing-reachable",
        ),
        pytest.param(["webhook"], True, recipient(), ("webhook",), (), id="one-platform-single"),
    ],
)
def test_plan(
    channels: list[str],
    one_platform: bool,
    person: dict[str, Any],
    delivered: tuple[str, ...],
    verdicts: tuple[Verdict, ...],
) -> None:
    result = plan(REQUEST, ntype(channels, one_platform), person, now=NOW, needs_address=ADAPTERS)
    assert result.channels == delivered
    assert result.verdicts == verdicts
    assert result.delivers is bool(delivered)
    # Every channel of the type is either delivered or has exactly one recorded reason.
    accounted = list(result.channels) + [v.channel for v in result.verdicts]
    assert sorted(accounted) == sorted(channels)


def test_plan_is_pure() -> None:
    person = recipient(sms="+15550100")
    args = (REQUEST, ntype(["sms", "webhook"], True), person)
    assert plan(*args, now=NOW, needs_address=ADAPTERS) == plan(
        *args, now=NOW, needs_address=ADAPTERS
    )
    assert person == recipient(sms="+15550100")
