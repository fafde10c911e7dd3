"""The recipient's working calendar: which weekdays they work and which public holidays they keep.

Where a calendar comes from (DESIGN.md invariant 7), in order:

1. the workweek set on the recipient (weekday ints, Monday=0), if any;
2. else the weekend of their country — the explicit country on the recipient, else the country of
   their IANA zone (tzdata's zone table, `scheduling.zones.country_of_zone`);
3. a zone with no country (UTC, Etc/*, the POSIX-style zones) gets a Monday–Friday week and no
   holidays. There is never a default country for everybody; `WorkCalendar.source` says which case
   applied, so `clarion explain` can show it.

Public holidays (the package's `public` category, names in English where the package has them) come
from the country (and subdivision) found in step 2, also when the workweek is explicit.

Weekends are per country *and per date*: the `holidays` package (0.109 checked) decides the weekend
per date, and models weekend changes over time — the UAE moved from Friday–Saturday to
Saturday–Sunday on 2022-01-01, Kuwait from Thursday–Friday to Friday–Saturday on 2007-09-01, and
Malaysia's weekend depends on the state. It also knows working days moved onto a weekend (Russia's
"transferred" Saturdays); those count as working days only with the country's own weekend, not with an
explicit workweek. Its weekend data is cross-checked against CLDR's, and where the two disagree (or
are both wrong, as for Nepal) the cited table in `scheduling.weekends` decides. tests/unit pins the
UAE change and runs the cross-check over every country, so a release of either library that changes
a weekend fails a test rather than a recipient.

On a day that is both weekend and holiday the reason given is the weekend: it is the standing rule.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache
from typing import Literal

import holidays
from holidays import HolidayBase

from clarion.scheduling.weekends import override_weekend
from clarion.scheduling.zones import country_of_zone, load_zone

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MON_FRI: frozenset[int] = frozenset(range(5))

Policy = Literal["skip", "next_working_day", "send"]
POLICIES: tuple[Policy, ...] = ("skip", "next_working_day", "send")


@dataclass(frozen=True)
class WorkCalendar:
    """A recipient's calendar. `workweek` None means the country's own weekend (per date), or
    Monday–Friday when there is no country either. `source` says where it came from; it takes no
    part in equality, so two recipients with the same calendar share caches."""

    country: str | None
    subdivision: str | None
    workweek: frozenset[int] | None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.workweek is not None:
            week = frozenset(self.workweek)
            if not week or not all(isinstance(d, int) and 0 <= d <= 6 for d in week):
                raise ValueError(
                    f"workweek must list weekdays 0 (Monday) to 6 (Sunday), not {self.workweek!r}"
                )
            object.__setattr__(self, "workweek", week)
        if self.country is None:
            if self.subdivision is not None:
                raise ValueError(f"subdivision {self.subdivision!r} needs a country")
            return
        object.__setattr__(self, "country", self.country.upper())
        problem = _unsupported(self.country, self.subdivision)
        if problem:
            raise ValueError(problem)


def calendar_for(
    *, workweek: Iterable[int] | None, country: str | None, subdivision: str | None, zone: str
) -> WorkCalendar:
    """The calendar of a recipient with these settings (see the module docstring for the order).

    Raises ValueError for an unknown zone or a malformed workweek. A country or subdivision the
    holidays package does not know is left out (and `source` says so) rather than raised: this runs
    on every tick, and one recipient's odd setting must not stop it."""
    return _calendar_for(
        None if workweek is None else frozenset(workweek), country, subdivision, zone
    )


@lru_cache(maxsize=4096)  # pure; a tick asks once per due series, for a few dozen distinct settings
def _calendar_for(
    week: frozenset[int] | None, country: str | None, subdivision: str | None, zone: str
) -> WorkCalendar:
    load_zone(zone)
    code, origin, notes = _country(country, zone)
    subdiv = _subdivision(code, subdivision)
    if subdivision and code and subdiv is None:
        notes.append(f"subdivision {subdivision!r} unknown for {code}: national holidays only")
    source = _describe(code, subdiv, week, origin, zone) + "".join(f"; {n}" for n in notes)
    return WorkCalendar(code, subdiv, week, source)


def _country(country: str | None, zone: str) -> tuple[str | None, str, list[str]]:
    """(country code, where it came from, notes): the recipient's, else the zone's."""
    code = country.strip().upper() if country else None
    if code and not _unsupported(code, None):
        return code, "the recipient's country", []
    notes = [f"country {code!r} unknown to the holidays package"] if code else []
    code = country_of_zone(zone)
    if code and _unsupported(code, None):
        notes.append(f"country {code!r} of zone {zone} unknown to the holidays package")
        code = None
    return code, f"the country of zone {zone}", notes


def _describe(
    code: str | None, subdiv: str | None, week: frozenset[int] | None, origin: str, zone: str
) -> str:
    place = f"{code}-{subdiv}" if subdiv else code
    if week is None and code is None:
        return f"Mon–Fri week and no holidays: zone {zone} has no country (no default country is assumed)"
    if week is None:
        return f"{place}, {origin}: weekend and public holidays from the holidays package"
    own = f"workweek from the recipient's setting (off {_days_label(_off(week))})"
    if code is None:
        return f"{own}; no holidays: zone {zone} has no country"
    return f"{own}; public holidays of {place}, {origin}"


def is_working_day(cal: WorkCalendar, day: date) -> bool:
    """True when `day` (a local date) is neither a weekend day nor a public holiday for `cal`."""
    return non_working_reason(cal, day) is None


@lru_cache(maxsize=65536)  # pure (the calendar's `source` takes no part in equality)
def non_working_reason(cal: WorkCalendar, day: date) -> str | None:
    """Why `day` is not a working day ("weekend (IL: Fri–Sat)", "holiday: Yom Kippur"); None if it is."""
    if cal.country is None:
        week = cal.workweek if cal.workweek is not None else MON_FRI
        if day.weekday() in week:
            return None
        label = "workweek setting" if cal.workweek is not None else "no country"
        return f"weekend ({label}: {_days_label(_off(week))})"
    book = _holidays(cal.country, cal.subdivision, day.year)
    if cal.workweek is not None:
        if day.weekday() not in cal.workweek:
            return f"weekend (workweek setting: {_days_label(_off(cal.workweek))})"
    else:
        weekend = _country_weekend(cal.country, book, day)
        if day.weekday() in weekend and day not in getattr(book, "weekend_workdays", ()):
            return f"weekend ({cal.country}: {_days_label(weekend)})"
    name = book.get(day)
    return f"holiday: {name}" if name else None


def adjust(
    cal: WorkCalendar, local: datetime, policy: Policy
) -> tuple[datetime | None, str | None]:
    """Apply a type's non-working-day policy to a local wall-time occurrence.

    On a working day: (local, None). On a non-working day: "skip" -> (None, reason);
    "next_working_day" -> (the next working day at the same wall time, reason); "send" -> (local, None).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown calendar policy {policy!r}: use one of {', '.join(POLICIES)}")
    reason = non_working_reason(cal, local.date())
    if reason is None or policy == "send":
        return local, None
    if policy == "skip":
        return None, reason
    return datetime.combine(add_working_days(cal, local.date(), 1), local.time()), reason


def add_working_days(cal: WorkCalendar, day: date, k: int) -> date:
    """The k-th working day after `day` (k=0 is `day` itself, working or not). O(years), not O(days):
    each year's working days are computed once and cached."""
    if k < 0:
        raise ValueError(f"k must be >= 0, not {k}")
    if k == 0:
        return day
    year, after = day.year, day.toordinal()
    while True:
        days = _working_ordinals(cal, year)
        start = bisect_right(days, after)
        if k <= len(days) - start:
            return date.fromordinal(days[start + k - 1])
        k -= len(days) - start
        year += 1


def working_days_between(cal: WorkCalendar, start: date, end: date) -> int:
    """How many working days fall in (start, end]; 0 when end <= start."""
    if end <= start:
        return 0
    total = 0
    for year in range(start.year, end.year + 1):
        days = _working_ordinals(cal, year)
        total += bisect_right(days, end.toordinal()) - bisect_right(days, start.toordinal())
    return total


@lru_cache(maxsize=1024)
def _working_ordinals(cal: WorkCalendar, year: int) -> tuple[int, ...]:
    first, last = date(year, 1, 1).toordinal(), date(year, 12, 31).toordinal()
    found = tuple(o for o in range(first, last + 1) if is_working_day(cal, date.fromordinal(o)))
    if not found:
        raise ValueError(f"calendar {cal} has no working day in {year}")
    return found


@lru_cache(maxsize=1024)
def _holidays(country: str, subdivision: str | None, year: int) -> HolidayBase:
    """The package's holidays for one (country, subdivision, year): slow to build, so built once.
    expand=False keeps the cached object read-only (a lookup in another year adds nothing)."""
    return holidays.country_holidays(
        country, subdiv=subdivision, years=year, expand=False, language=_english(country)
    )


@lru_cache(maxsize=512)
def _english(country: str) -> str | None:
    languages = holidays.country_holidays(country, years=()).supported_languages
    return next((lang for lang in ("en_US", "en_GB", "en") if lang in languages), None)


@lru_cache(maxsize=1024)
def _unsupported(country: str, subdivision: str | None) -> str | None:
    try:
        holidays.country_holidays(country, subdiv=subdivision, years=())
    except NotImplementedError as exc:
        return f"holidays package: {exc}"
    return None


def _subdivision(country: str | None, subdivision: str | None) -> str | None:
    """The package's code for a subdivision ("BY" or ISO 3166-2 "DE-BY"); None if unknown."""
    if not country or not subdivision:
        return None
    code = subdivision.strip().upper().removeprefix(f"{country}-")
    return None if _unsupported(country, code) else code


def _country_weekend(country: str, book: HolidayBase, day: date) -> frozenset[int]:
    """The country's weekend on `day`: the override table's where it has one, else the package's
    per-date rule (UAE, Kuwait, Malaysian states); `weekend` alone is today's rule."""
    if (table := override_weekend(country, day)) is not None:
        return table
    rule = getattr(book, "_get_weekend", None)
    return frozenset(rule(day) if rule else book.weekend)


def _off(week: frozenset[int]) -> frozenset[int]:
    return frozenset(range(7)) - week


def _days_label(days: frozenset[int]) -> str:
    """Fri–Sat, Sat–Sun, Sun, or Mon, Thu for days that do not follow each other."""
    if not days:
        return "none"
    for first in range(7):
        run = [(first + i) % 7 for i in range(len(days))]
        if set(run) == days and (len(days) == 7 or (first - 1) % 7 not in days):
            return (
                DAY_NAMES[run[0]] if len(run) == 1 else f"{DAY_NAMES[run[0]]}–{DAY_NAMES[run[-1]]}"
            )
    return ", ".join(DAY_NAMES[d] for d in sorted(days))
