"""One tz database for every zone computation: the pinned `tzdata` package, never the host's.

`zoneinfo.ZoneInfo(name)` reads the host's /usr/share/zoneinfo first (or whatever PYTHONTZPATH
says) and falls back to the tzdata package only when the host has no file. Two workers on hosts
with different system tzdata would then compute different due times for the same series (Morocco's
Ramadan shifts change with most releases). So clarion never calls ZoneInfo(name): every zone comes
from `load_zone`, which reads the file out of the installed tzdata package, and the list of valid
names is that package's own list (`zone_names`). `TZ_DATABASE` names the release; it is recorded in
the database at migration and a worker with another one refuses to start (tasks/app.py).

The zone → country table (zone.tab and its backward links) comes from the same package.
"""

from __future__ import annotations

from functools import cache, lru_cache
from importlib import resources
from zoneinfo import ZoneInfo

import tzdata

TZ_DATABASE: str = tzdata.IANA_VERSION
"""The IANA release every zone computation uses, e.g. "2026f"."""
TZDATA_PACKAGE: str = tzdata.__version__
"""The tzdata package version carrying it, e.g. "2026.6"."""

_NOT_ZONES = frozenset({"Factory", "localtime", "posixrules"})


def describe() -> str:
    """ "2026f (tzdata 2026.6)", for logs, stats and refusals."""
    return f"{TZ_DATABASE} (tzdata {TZDATA_PACKAGE})"


def _read(name: str) -> str:
    return resources.files("tzdata").joinpath("zoneinfo", name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def zone_names() -> frozenset[str]:
    """Every IANA zone name the tzdata package has (its `zones` list), links included."""
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip()) - _NOT_ZONES


def load_zone(name: str) -> ZoneInfo:
    """The rules of zone `name` from the tzdata package; ValueError for a name not in its list.

    Checking the name against the list first also keeps paths ("../x", "/etc/passwd") away from
    the file lookup."""
    if not isinstance(name, str) or name not in zone_names():
        raise ValueError(f"not an IANA time zone: {name!r}")
    return _load(name)


@cache
def _load(name: str) -> ZoneInfo:
    # One object per name, as ZoneInfo's own cache gives: datetimes in the same zone then compare
    # by wall time the way they would with ZoneInfo(name).
    path = resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
    with path.open("rb") as tzif:
        return ZoneInfo.from_file(tzif, key=name)


@lru_cache(maxsize=1)
def _zone_countries() -> dict[str, str]:
    countries: dict[str, str] = {}
    for line in _read("zone.tab").splitlines():
        if line and not line.startswith("#"):
            code, _coords, zone, *_ = line.split("\t")
            countries[zone] = code
    # backward links, e.g. Asia/Tel_Aviv -> Asia/Jerusalem
    for line in _read("tzdata.zi").splitlines():
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
