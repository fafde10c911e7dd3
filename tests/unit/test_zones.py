"""scheduling/zones.py: the country of an IANA zone, from tzdata's own tables (zone.tab + links)."""

from __future__ import annotations

import pytest

from scheduling.zones import country_of, country_of_zone


@pytest.mark.parametrize(
    ("zone", "country"),
    [
        pytest.param("Asia/Jerusalem", "IL", id="jerusalem"),
        pytest.param("Asia/Tel_Aviv", "IL", id="tel-aviv-is-a-link"),
        pytest.param("Asia/Dubai", "AE", id="dubai"),
        pytest.param("America/New_York", "US", id="new-york"),
        pytest.param("America/Los_Angeles", "US", id="los-angeles"),
        pytest.param("Europe/London", "GB", id="london"),
        pytest.param("Europe/Belfast", "GB", id="belfast-is-a-link"),
        pytest.param("Europe/Berlin", "DE", id="berlin"),
        pytest.param("Asia/Kolkata", "IN", id="kolkata"),
        pytest.param("Asia/Calcutta", "IN", id="calcutta-is-a-link"),
        pytest.param("Pacific/Auckland", "NZ", id="auckland"),
        pytest.param("Asia/Tokyo", "JP", id="tokyo"),
        pytest.param("US/Eastern", "US", id="us-eastern-is-a-link"),
        pytest.param("UTC", None, id="utc"),
        pytest.param("Etc/UTC", None, id="etc-utc"),
        pytest.param("Etc/GMT+3", None, id="etc-gmt-plus-3"),
        pytest.param("Etc/GMT-14", None, id="etc-gmt-minus-14"),
        pytest.param("Nowhere/Atlantis", None, id="not-a-zone"),
        pytest.param("", None, id="empty"),
    ],
)
def test_country_of_zone(zone: str, country: str | None) -> None:
    assert country_of_zone(zone) == country


@pytest.mark.parametrize(
    ("explicit", "zone", "country"),
    [
        pytest.param("DE", "America/New_York", "DE", id="explicit-beats-zone"),
        pytest.param("IL", "UTC", "IL", id="explicit-with-countryless-zone"),
        pytest.param("US", "Asia/Dubai", "US", id="explicit-us-in-dubai"),
        pytest.param(None, "Asia/Dubai", "AE", id="no-explicit-uses-zone"),
        pytest.param(None, "Asia/Tel_Aviv", "IL", id="no-explicit-uses-link"),
        pytest.param("", "Europe/London", "GB", id="empty-explicit-uses-zone"),
        pytest.param(None, "UTC", None, id="neither"),
        pytest.param(None, "Etc/GMT+3", None, id="neither-etc"),
    ],
)
def test_country_of_prefers_the_explicit_country(
    explicit: str | None, zone: str, country: str | None
) -> None:
    assert country_of(explicit, zone) == country
