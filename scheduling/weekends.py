"""Which weekdays are a country's weekend: two sources, and a cited table where they disagree.

The `holidays` package decides the weekend per date (the UAE's 2022 switch, Malaysian states), and
clarion uses it by default. Its weekend data is cross-checked against CLDR's week data (the
`weekData` of Unicode's supplemental data, shipped in `babel`): tests/unit/test_weekends.py runs
over every country either source knows and fails when the two disagree anywhere OVERRIDES does
not decide, and when an override has become unnecessary (both sources now say what it says).

OVERRIDES decides every disagreement, and also Nepal, where both sources agree and are both wrong
(holidays 0.109 and CLDR 48 give Saturday–Sunday; Nepal's weekend is Saturday only, but for a
month in 2022). Each entry names its sources; `follows` says which library it agrees with today
("holidays", "CLDR", or "neither"). Where the only evidence is the two libraries, the entry says
how it chose: the holidays package gives several countries a Sunday-only weekend next to the
public-holidays law it implements (that set drives its "observed on Monday" rules), while CLDR
records the office week, which is what a working-day nudge needs.

Weekdays are ints, Monday=0 .. Sunday=6, as in `date.weekday()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from functools import lru_cache

import holidays
from babel import Locale, UnknownLocaleError, localedata

MON, TUE, WED, THU, FRI, SAT, SUN = range(7)
SAT_SUN = frozenset({SAT, SUN})
FRI_SAT = frozenset({FRI, SAT})
CLDR_WORLD = SAT_SUN  # weekData for territory "001": every territory CLDR does not list


@dataclass(frozen=True)
class Rule:
    since: date | None  # first day it applies; None: every date before the next rule
    weekend: frozenset[int]


@dataclass(frozen=True)
class Override:
    rules: tuple[Rule, ...]  # oldest first
    follows: str  # "holidays", "CLDR" or "neither": which source agrees with the current rule
    source: str

    def weekend_on(self, day: date) -> frozenset[int]:
        current = self.rules[0].weekend
        for rule in self.rules:
            if rule.since is None or rule.since <= day:
                current = rule.weekend
        return current

    @property
    def current(self) -> frozenset[int]:
        return self.rules[-1].weekend


def _always(*days: int) -> tuple[Rule, ...]:
    return (Rule(None, frozenset(days)),)


_SUNDAY_ONLY_IN_HOLIDAYS = (
    "holidays 0.109 declares weekend={SUN} next to the public-holidays law it implements (e.g. "
    "holidays/countries/venezuela.py, 'Ley de Fiestas Nacionales'), which drives its observed-day "
    "rules; CLDR weekData gives the Saturday–Sunday office week, which clarion follows"
)

OVERRIDES: dict[str, Override] = {
    "NP": Override(
        (
            Rule(None, frozenset({SAT})),
            Rule(date(2022, 5, 15), SAT_SUN),
            Rule(date(2022, 6, 15), frozenset({SAT})),
        ),
        "neither",
        "Saturday only, but for a trial of Saturday–Sunday from 2022-05-15 (Council of Ministers "
        "decision of 2022-04-26, Nepal Gazette notice reported by Khabarhub 2022-05-10: 'prior to "
        "this, only Saturday was a public holiday') revoked by the cabinet on 2022-06-06 with "
        "effect from 2022-06-15 (ANI via Devdiscourse 2022-06-06; Fiscal Nepal 2022-06-06)",
    ),
    "MR": Override(
        (Rule(None, FRI_SAT), Rule(date(2014, 10, 1), SAT_SUN)),
        "CLDR",
        "Council of Ministers of 2014-09-11: the weekly rest moves back to Saturday–Sunday from "
        "2014-10-01 (Mauritanian News Agency via qppstudio.net 2014-09-12; AFP 2014-09-11); "
        "Friday–Saturday since the cabinet decision of 2007-12-13",
    ),
    "LY": Override(
        _always(FRI, SAT),
        "CLDR",
        "Friday–Saturday for administrative institutions (Libyan government via Panapress/ANBA); "
        "government decision 110/2023 makes a Sunday between the weekend and a holiday a bridge "
        "day (Afrigate News 2023)",
    ),
    "DJ": Override(
        _always(FRI),
        "neither",
        "Friday is the only weekend day (publicholidays.africa, Djibouti; bank-holidays.com, "
        "'Weekend: Friday'); the labour code's weekly rest falls preferably on Friday",
    ),
    "AF": Override(
        _always(FRI),
        "neither",
        "Friday only under the current government, which cancelled the Friday–Saturday weekend "
        "of the Islamic Republic (Asr Iran via Rokna; Thursday–Friday for state employees before, "
        "Afghanistan Today 2015-10-20); the date of the change is not known here, so the rule "
        "applies to every date",
    ),
    "HK": Override(
        (Rule(None, frozenset({SUN})), Rule(date(2006, 7, 1), SAT_SUN)),
        "CLDR",
        "five-day week in the civil service from 2006-07-01, resting on Saturdays and Sundays "
        "(HKSAR Government press release 2006-05-08, info.gov.hk/gia/general/200605/08); "
        + _SUNDAY_ONLY_IN_HOLIDAYS,
    ),
    "BD": Override(
        _always(FRI, SAT),
        "holidays",
        "Fridays and Saturdays are the weekly holiday of government offices (Cabinet Division, "
        "Prothom Alo 2021-04-05; introduced 2005-09-09, The Daily Star 2005-09-06)",
    ),
    "BN": Override(
        _always(FRI, SUN),
        "holidays",
        "Friday and Sunday (holidays/countries/brunei.py; Saturday is a working day)",
    ),
    "MV": Override(
        _always(FRI, SAT),
        "holidays",
        "Friday–Saturday (holidays/countries/maldives.py and its references; geographylists.com)",
    ),
    "IN": Override(
        _always(SAT, SUN),
        "holidays",
        "five-day week, all Saturdays closed, in the Government of India's administrative offices "
        "from 1985-06-03 (DoPT O.M. No. 13/4/85-JCA of 1985-05-21); CLDR's Sunday-only weekend is "
        "the six-day week of parts of the private sector",
    ),
    "UG": Override(
        _always(SAT, SUN),
        "holidays",
        "Monday to Friday under the Public Service Standing Orders (Standard Bank Trade Club, "
        "Uganda, May 2024); CLDR gives Sunday only",
    ),
    **{
        code: Override(_always(SAT, SUN), "CLDR", _SUNDAY_ONLY_IN_HOLIDAYS)
        for code in ("AI", "CD", "KN", "NE", "PY", "TK", "VE")
    },
}


def override_weekend(country: str, day: date) -> frozenset[int] | None:
    """The table's weekend for `country` on `day`, or None where the holidays package decides."""
    entry = OVERRIDES.get(country)
    return entry.weekend_on(day) if entry else None


def countries() -> list[str]:
    """Every ISO 3166 alpha-2 country the holidays package supports (a superset of the zones')."""
    return sorted(c for c in holidays.list_supported_countries() if len(c) == 2 and c.isalpha())


def holidays_weekend(country: str) -> frozenset[int]:
    """The holidays package's current weekend rule for `country`."""
    return frozenset(holidays.country_holidays(country, years=()).weekend)


@lru_cache(maxsize=512)
def cldr_weekend(country: str) -> frozenset[int]:
    """CLDR's weekend for a territory, from babel's locale data (the week data of any locale in
    that territory: CLDR keys it by territory). The world default where CLDR has no locale."""
    locale = _locale_in(country)
    if locale is None:
        return CLDR_WORLD
    start, end = locale.weekend_start, locale.weekend_end
    return frozenset((start + i) % 7 for i in range((end - start) % 7 + 1))


def _locale_in(country: str) -> Locale | None:
    try:
        locale = Locale.parse(f"und_{country}")
        if locale.territory == country:
            return locale
    except (UnknownLocaleError, ValueError):
        pass
    found = next((i for i in localedata.locale_identifiers() if i.endswith(f"_{country}")), None)
    return Locale.parse(found) if found else None


@dataclass(frozen=True)
class Disagreement:
    country: str
    holidays: frozenset[int]
    cldr: frozenset[int]
    override: frozenset[int] | None


def disagreements() -> list[Disagreement]:
    """Every country where the holidays package and CLDR give different weekends today."""
    found = []
    for code in countries():
        h, c = holidays_weekend(code), cldr_weekend(code)
        if h != c:
            entry = OVERRIDES.get(code)
            found.append(Disagreement(code, h, c, entry.current if entry else None))
    return found
