"""scheduling/zones.py: zones from the pinned tzdata package only, and the country of a zone."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from clarion.scheduling.zones import country_of, country_of_zone, load_zone, zone_names
from tests.support.syntax import parse


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


# --- one tz database: the pinned tzdata package, whatever the host has ---------------------------

APP_PACKAGES = (
    "clarion",
    "db",
    "catalog",
    "adapters",
    "tasks",
    "gates",
    "scheduling",
    "ops",
    "web",
)
ROOT = Path(__file__).resolve().parents[2]


def _host_zone_reads(path: Path) -> list[str]:
    """Calls that would read the host's zoneinfo: ZoneInfo(...), available_timezones(), and
    datetime.astimezone() with no zone (the host's local time)."""
    found = []
    for node in ast.walk(parse(path)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        bare_astimezone = name == "astimezone" and not node.args and not node.keywords
        if name in ("ZoneInfo", "available_timezones", "reset_tzpath") or bare_astimezone:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}()")
    return found


def test_no_application_code_reads_the_hosts_zoneinfo() -> None:
    files = [p for pkg in APP_PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    assert len(files) > 50
    assert [hit for p in files for hit in _host_zone_reads(p)] == []


def test_load_zone_takes_only_names_from_the_tzdata_list() -> None:
    assert str(load_zone("Europe/Berlin")) == "Europe/Berlin"
    assert load_zone("Asia/Kathmandu") is load_zone("Asia/Kathmandu")  # one object per name
    for bad in ("../zoneinfo/UTC", "/etc/passwd", "zone.tab", "Factory", "Nowhere/Atlantis", ""):
        with pytest.raises(ValueError, match="not an IANA time zone"):
            load_zone(bad)
    assert {"UTC", "Etc/UTC", "Asia/Tel_Aviv", "America/Argentina/Buenos_Aires"} <= zone_names()


# What the subprocess computes: due times of weekly, daily and monthly series over two years in
# zones whose rules change often, quiet-hours ends and the day bucket of the fatigue caps, plus
# a control that asks the standard library's ZoneInfo directly.
PROBE = """
import json, zoneinfo
from datetime import UTC, datetime, time, timedelta
from clarion.gates.fatigue_caps import cap_buckets
from clarion.gates.quiet import quiet_until
from clarion.rows import Recipient
from clarion.scheduling.recurrence import Every, due_at
from clarion.tasks.producer import validate_timezone

zones = ["Africa/Casablanca", "America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe"]
every = {"weekly": Every(1, "weeks"), "daily": Every(3, "days"), "monthly": Every(1, "months")}
out = {"due": {}, "quiet": {}, "caps": {}}
for zone in zones:
    validate_timezone(zone)
    for name, step in every.items():
        due = [due_at(datetime(2026, 1, 5, 9, 30), zone, step, n) for n in range(105)]
        out["due"][f"{zone} {name}"] = [d.isoformat() for d in due]
    nows = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=37 * i) for i in range(60)]
    out["quiet"][zone] = [
        str(quiet_until(time(22), time(7), zone, now)) for now in nows
    ]
    out["caps"][zone] = [cap_buckets(Recipient("u", zone, "en", None, None, {}, None, None, None, None), now)[0][1] for now in nows]
summer = datetime(2026, 7, 1, 12, tzinfo=UTC)
out["control"] = str(summer.astimezone(zoneinfo.ZoneInfo("America/New_York")).utcoffset())
print(json.dumps(out))
"""


def _probe(tzpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONTZPATH")}
    if tzpath is not None:
        env["PYTHONTZPATH"] = tzpath
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_host_with_other_zoneinfo_computes_the_same_due_times(tmp_path: Path) -> None:
    """Three hosts: this one's own /usr/share/zoneinfo; one with none at all (an empty TZPATH);
    one whose zoneinfo is deliberately wrong (every zone a copy of UTC). Each computes the same
    due times, quiet-hours ends and cap buckets, because only the tzdata package is read."""
    empty = tmp_path / "empty"
    empty.mkdir()
    wrong = tmp_path / "wrong"
    utc = resources.files("tzdata.zoneinfo").joinpath("UTC").read_bytes()
    for zone in ("Africa/Casablanca", "America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe"):
        (wrong / zone).parent.mkdir(parents=True, exist_ok=True)
        (wrong / zone).write_bytes(utc)
    here, none, broken = _probe(None), _probe(str(empty)), _probe(str(wrong))
    assert broken["control"] == "0:00:00"  # the wrong zoneinfo is what ZoneInfo() itself reads
    assert none["control"] == "-1 day, 20:00:00"  # no host data: the stdlib falls back to tzdata
    for other in (none, broken):
        assert {k: v for k, v in other.items() if k != "control"} == {
            k: v for k, v in here.items() if k != "control"
        }
    # and what they agree on is New York's summer time, not UTC
    assert here["due"]["America/New_York weekly"][30] == "2026-08-03T13:30:00+00:00"
