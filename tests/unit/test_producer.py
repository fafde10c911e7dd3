"""tasks/producer.validate_timezone: only IANA zone names pass."""

from __future__ import annotations

import re

import pytest

from clarion.errors import InvalidRequest, InvalidTimezone
from clarion.tasks.producer import validate_timezone


@pytest.mark.parametrize(
    "zone",
    [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "America/Argentina/Buenos_Aires",
        "Asia/Jerusalem",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
        "Pacific/Chatham",
        "Etc/GMT+3",
        "Etc/UTC",
    ],
)
def test_valid_zones_are_returned_unchanged(zone: str) -> None:
    assert validate_timezone(zone) == zone


@pytest.mark.parametrize(
    "zone",
    [
        "Mars/Olympus",
        "",
        "../etc/passwd",
        "/etc/passwd",
        "/usr/share/zoneinfo/UTC",
        "./UTC",
        "Europe/../../../etc/passwd",
        "UTC+3",
        "GMT+03:00",
        "+03:00",
        "CEST",
        "europe/berlin",
        " Europe/Berlin",
        "Europe/Berlin ",
        "Europe/Berlin\x00",
        "Europe/Berlin/",
        "zone.tab",
        "tzdata.zi",
    ],
)
def test_invalid_zones_are_rejected(zone: str) -> None:
    with pytest.raises(
        InvalidTimezone, match=rf"^timezone: not an IANA time zone: {re.escape(repr(zone))}$"
    ) as caught:
        validate_timezone(zone)
    assert caught.value.zone == zone
    assert isinstance(caught.value, InvalidRequest)


@pytest.mark.parametrize("zone", [None, 3, ["UTC"]])
def test_non_strings_are_rejected(zone: object) -> None:
    with pytest.raises(InvalidTimezone, match=r"^timezone: not an IANA time zone: "):
        validate_timezone(zone)  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["Europe", "America", "America/Argentina", "Etc"])
def test_zone_directory_is_rejected(zone: str) -> None:
    with pytest.raises(
        InvalidTimezone, match=rf"^timezone: not an IANA time zone: {re.escape(repr(zone))}$"
    ):
        validate_timezone(zone)
