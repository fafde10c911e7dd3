"""Which country an IANA zone belongs to, from tzdata's own zone table (zone.tab and its links)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources


def _read(name: str) -> str:
    return resources.files("tzdata").joinpath("zoneinfo", name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _zone_countries() -> dict[str, str]:
    countries: dict[str, str] = {}
    for line in _read("zone.tab").splitlines():
        if line and not line.startswith("#"):
            code, _coords, zone, *_ = line.split("\t")
            countries[zone] = code
    for line in _read(
        "tzdata.zi"
    ).splitlines():  # backward links, e.g. Asia/Tel_Aviv -> Asia/Jerusalem
        if line.startswith("L "):
            _, target, link = line.split()[:3]
            if target in countries and link not in countries:
                countries[link] = countries[target]
    return countries


def country_of_zone(zone: str) -> str | None:
    """ISO 3166 alpha-2 code of the country a zone is in; None for UTC, Etc/* and oceans."""
    return _zone_countries().get(zone)


def country_of(recipient_country: str | None, zone: str) -> str | None:
    """The recipient's explicit country, else the country of their zone."""
    return recipient_country or country_of_zone(zone)
