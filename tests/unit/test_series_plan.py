"""scheduling/series.py: what the tick records — merges of moved occurrences, missed texts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from clarion.scheduling.calendars import calendar_for
from clarion.scheduling.series import MAX_MISSED_ROWS, describe, plan_tick, preview

NEW_YORK = calendar_for(workweek=None, country=None, subdivision=None, zone="America/New_York")
MON_THU = calendar_for(workweek=[0, 1, 2, 3], country=None, subdivision=None, zone="UTC")
GRACE = timedelta(hours=2)


def series(**kw) -> dict:
    return {
        "anchor_local": datetime(2026, 12, 4, 9, 0),  # a Friday
        "zone": "America/New_York",
        "every": "1d",
        "calendar_policy": "next_working_day",
        "next_n": 0,
        "max_count": None,
        "until": None,
        **kw,
    }


def week(row: dict, cal) -> list[tuple[str, str, int | None, str | None]]:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    return [
        (local.strftime("%a"), occ.action, occ.merged_into, occ.merge_kind)
        for _n, _due, local, occ in preview(row, cal, start=start, end=start + timedelta(days=12))
    ]


def test_a_daily_series_merges_the_weekend_into_mondays_own_occurrence() -> None:
    got = week(series(), NEW_YORK)
    assert got[:5] == [
        ("Fri", "send", None, None),
        ("Sat", "merged", 3, "own"),
        ("Sun", "merged", 3, "own"),
        ("Mon", "send", None, None),
        ("Tue", "send", None, None),
    ]


def test_a_moved_occurrence_is_kept_where_the_day_has_none_of_its_own() -> None:
    weekly_saturday = series(anchor_local=datetime(2026, 12, 5, 9, 0), every="1w")
    assert week(weekly_saturday, NEW_YORK)[:2] == [
        ("Sat", "moved", None, None),
        ("Sat", "moved", None, None),
    ]


def test_two_occurrences_moved_onto_a_day_without_its_own_merge_into_the_first() -> None:
    # Mon–Thu week: Friday 4th and Sunday 6th both land on Monday 7th; Tuesday 8th is the next
    every_two_days = series(zone="UTC", every="2d")
    assert week(every_two_days, MON_THU)[:3] == [
        ("Fri", "moved", None, None),
        ("Sun", "merged", 0, "moved"),
        ("Tue", "send", None, None),
    ]


def test_a_merge_respects_the_series_count() -> None:
    # Monday would be occurrence 3, but the series ends after 3 (0..2): Saturday's is kept
    got = week(series(max_count=3), NEW_YORK)
    assert got == [
        ("Fri", "send", None, None),
        ("Sat", "moved", None, None),
        ("Sun", "merged", 1, "moved"),
    ]


def test_skip_and_send_policies_never_merge() -> None:
    assert {a for _, a, _, _ in week(series(calendar_policy="skip"), NEW_YORK)} == {
        "send",
        "skipped",
    }
    assert {a for _, a, _, _ in week(series(calendar_policy="send"), NEW_YORK)} == {"send"}


def test_describe_names_the_original_and_the_new_date_and_why() -> None:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    occs = {
        local.strftime("%a"): occ
        for _, _, local, occ in preview(
            series(anchor_local=datetime(2026, 12, 5, 9, 0), every="1w"),
            NEW_YORK,
            start=start,
            end=start + timedelta(days=6),
        )
    }
    assert describe(occs["Sat"], "America/New_York") == (
        "moved from Sat 2026-12-05 09:00 to Mon 2026-12-07 09:00 (weekend (US: Sat–Sun))"
    )
    merged = {
        local.strftime("%a"): occ
        for _, _, local, occ in preview(
            series(), NEW_YORK, start=start, end=start + timedelta(days=6)
        )
    }
    assert describe(merged["Sun"], "America/New_York") == (
        "moved from Sun 2026-12-06 09:00 to Mon 2026-12-07 09:00 (weekend (US: Sat–Sun)); merged "
        "into occurrence 3 (that day's own occurrence): not sent again"
    )


def test_the_tick_merges_the_saturday_occurrence_when_it_falls_due() -> None:
    saturday_0905 = datetime(2026, 12, 5, 14, 5, tzinfo=UTC)
    plan = plan_tick(series(next_n=1), NEW_YORK, now=saturday_0905, grace=GRACE)
    (occ,) = plan.occurrences
    assert (occ.n, occ.action, occ.merged_into) == (1, "merged", 3)
    assert occ.send_at == datetime(2026, 12, 7, 14, 0, tzinfo=UTC)
    assert plan.next_n == 2


# --- missed: the real cause ------------------------------------------------------------------------


def test_missed_rows_name_an_anchor_in_the_past() -> None:
    armed = datetime(2026, 12, 10, 13, 0, tzinfo=UTC)
    row = series(every="1d", calendar_policy="send", created_at=armed)
    plan = plan_tick(row, NEW_YORK, now=armed, grace=GRACE)
    assert [o.action for o in plan.occurrences] == ["missed"] * 6  # Fri 4 .. Wed 9
    assert all("due before the series was armed" in o.reason for o in plan.occurrences)
    assert all("anchor 2026-12-04T09:00 is in the past" in o.reason for o in plan.occurrences)


def test_missed_rows_name_a_late_tick_and_only_the_latest_is_sent() -> None:
    armed = datetime(2026, 12, 1, tzinfo=UTC)
    row = series(every="1d", calendar_policy="send", created_at=armed)
    late = datetime(2026, 12, 6, 14, 30, tzinfo=UTC)  # Sunday 09:30 New York
    plan = plan_tick(row, NEW_YORK, now=late, grace=GRACE)
    assert [o.action for o in plan.occurrences] == ["missed", "missed", "send"]
    assert plan.occurrences[0].reason.startswith("missed: the tick came 2 days after it was due")
    assert "beat or the control-lane workers were not running" in plan.occurrences[0].reason


def test_beyond_the_missed_rows_limit_one_row_counts_the_rest_with_both_causes() -> None:
    anchor = datetime(2026, 1, 1, 9, 0)
    armed = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)  # 31 occurrences were already past
    row = series(anchor_local=anchor, calendar_policy="send", created_at=armed)
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # and beat then never ran until June
    plan = plan_tick(row, NEW_YORK, now=now, grace=GRACE)
    counted, *listed = plan.occurrences
    assert len(listed) == MAX_MISSED_ROWS
    first_listed = listed[0].n
    assert counted.n == first_listed - 1
    assert counted.reason.startswith(
        f"missed: this row stands for occurrences 0..{first_listed - 1} ({first_listed}), counted "
        "rather than recorded one by one (at most 50 missed rows per series and tick)"
    )
    assert "31 due before the series was armed (the anchor is in the past)" in counted.reason
    assert f"{first_listed - 31} fell due while the tick did not run" in counted.reason
