"""When a broadcast's recipients are requested: now, at one instant, or at a local wall time.

A local-time broadcast ("09:00") is requested zone by zone as 09:00 comes round the world: each
zone's next 09:00 (today in that zone, in the zone's own calendar date), with the zones that share
an instant grouped into one wave. A zone whose 09:00 already passed today gets tomorrow's
(`passed="tomorrow"`) or none (`passed="skip"`). Wall times a zone lacks or has twice follow
scheduling.recurrence (a gap moves forward by its length, a fold takes its first instant).
Pure: `now` is a parameter; every instant returned is aware UTC.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Literal, get_args

from clarion.scheduling.recurrence import to_utc
from clarion.scheduling.zones import load_zone

Passed = Literal["tomorrow", "skip"]
PASSED: tuple[Passed, ...] = get_args(Passed)


@dataclass(frozen=True)
class LocalPlan:
    waves: tuple[tuple[datetime, tuple[str, ...]], ...]  # (instant, zones), earliest first
    skipped: tuple[str, ...]  # zones whose wall time passed today (passed="skip")


def local_waves(now: datetime, wall: time, passed: Passed, zones: Iterable[str]) -> LocalPlan:
    """The instants at which `wall` next comes in each of `zones`, seen from `now`."""
    by_instant: dict[datetime, list[str]] = defaultdict(list)
    skipped = []
    for zone in sorted(set(zones)):
        today = now.astimezone(load_zone(zone)).date()
        at = to_utc(datetime.combine(today, wall), zone)
        if at < now:
            if passed == "skip":
                skipped.append(zone)
                continue
            at = to_utc(datetime.combine(today + timedelta(days=1), wall), zone)
        by_instant[at].append(zone)
    waves = tuple((at, tuple(by_instant[at])) for at in sorted(by_instant))
    return LocalPlan(waves, tuple(skipped))
