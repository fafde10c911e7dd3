"""Series against real PostgreSQL, issue 13: merged moves, re-arming, readable output, one tz
database per deployment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from clarion import clock
from clarion.db.engine import engine
from clarion.errors import ConfigurationError, SeriesConflict
from clarion.ops import cli
from clarion.ops.explain import explain
from clarion.ops.schedule import arm_preview, schedule
from clarion.ops.stats import tz_database
from clarion.scheduling import zones
from clarion.tasks import register_recipient
from clarion.tasks.app import check_tz_database
from clarion.tasks.route import route
from clarion.tasks.series import arm_series, tick_series
from tests.support.environment import ROOT

pytestmark = pytest.mark.integration

NY = "America/New_York"
FRIDAY_0905_NY = datetime(2026, 12, 4, 14, 5, tzinfo=UTC)


@pytest.fixture
def gates_catalog(clarion_env, monkeypatch):
    from tests.support.environment import reset_process_state

    monkeypatch.setenv("CLARION_CATALOG", str(ROOT / "tests" / "catalog_gates.yaml"))
    reset_process_state()
    return clarion_env


@pytest.fixture
def at():
    """Set the clock: at(datetime) — every clarion call after it sees that time."""
    yield lambda when: clock.set_source(lambda: when)
    clock.set_source(None)


def rows(sql: str, **params) -> list[tuple]:
    with engine().connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def tick(now: datetime) -> int:
    return tick_series(now=now)


def daily_from_friday(user: str = "ny", **kw):
    return arm_series(
        user,
        "weekly_one_on_one",
        anchor="2026-12-04T09:00",
        every="1d",
        calendar_policy="next_working_day",
        **kw,
    )


# --- 3. moved occurrences merge --------------------------------------------------------------------


def test_the_weekend_of_a_daily_series_merges_into_monday_and_is_not_sent_again(gates_catalog, at):
    register_recipient("ny", timezone=NY)
    sid = daily_from_friday().series_id
    for day in range(4):  # Friday .. Monday, each at 09:05 New York
        now = FRIDAY_0905_NY + timedelta(days=day)
        at(now)
        tick(now)
        pending = rows("SELECT user_id, id FROM requests WHERE state = 'pending'")
        if pending:
            route([u for u, _ in pending], [i for _, i in pending])
    got = rows("SELECT occurrence_key, state FROM requests ORDER BY id")
    assert got == [(f"series:{sid}:{n}", "routed") for n in range(4)]
    merged = rows(
        "SELECT r.occurrence_key, d.gate, d.outcome, d.reason, d.detail FROM decisions d "
        "JOIN requests r ON r.id = d.request_id WHERE d.reason = 'merged' ORDER BY r.id"
    )
    assert [m[:4] for m in merged] == [
        (f"series:{sid}:1", "calendar", "collapse", "merged"),
        (f"series:{sid}:2", "calendar", "collapse", "merged"),
    ]
    assert merged[0][4] == (
        "moved from Sat 2026-12-05 09:00 to Mon 2026-12-07 09:00 (weekend (US: Sat–Sun)); merged "
        f"into occurrence 3 (that day's own occurrence): not sent again (request series:{sid}:3)"
    )
    # Saturday's and Sunday's occurrences never reach a channel; Friday's and Monday's do
    delivered = rows(
        "SELECT r.occurrence_key FROM deliveries d JOIN requests r ON r.id = d.request_id "
        "ORDER BY r.id"
    )
    assert delivered == [(f"series:{sid}:0",), (f"series:{sid}:3",)]
    text_ = explain("ny", limit=10)
    assert text_.count("merged into occurrence 3") == 2
    assert "moved from Sun 2026-12-06 09:00 to Mon 2026-12-07 09:00" in text_


def test_a_merge_into_an_earlier_moved_occurrence_needs_it_still_held(gates_catalog, at):
    """Mon–Thu week, every 2 days from Friday: Friday's and Sunday's land on Monday. Sunday's
    merges into Friday's — unless Friday's was missed (beat down): then Sunday's is sent."""
    register_recipient("held", timezone="UTC", workweek=[0, 1, 2, 3])
    register_recipient("lost", timezone="UTC", workweek=[0, 1, 2, 3])
    ids = {}
    for user in ("held", "lost"):
        ids[user] = arm_series(
            user,
            "weekly_one_on_one",
            anchor="2026-12-04T09:00",
            every="2d",
            calendar_policy="next_working_day",
        ).series_id
    friday, sunday = (
        datetime(2026, 12, 4, 9, 5, tzinfo=UTC),
        datetime(2026, 12, 6, 9, 5, tzinfo=UTC),
    )
    with engine().begin() as conn:  # beat runs on Friday for "held" only
        conn.execute(
            text("UPDATE series SET next_due_at = next_due_at + interval '2 days' WHERE id = :i"),
            {"i": ids["lost"]},
        )
    tick(friday)
    tick(sunday)
    got = rows(
        "SELECT r.user_id, r.occurrence_key, r.state, r.due_at, d.reason FROM requests r "
        "LEFT JOIN decisions d ON d.request_id = r.id ORDER BY r.user_id, r.id"
    )
    monday = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    h, lost = ids["held"], ids["lost"]
    assert got == [
        ("held", f"series:{h}:0", "deferred", monday, "non_working_day"),
        ("held", f"series:{h}:1", "routed", None, "merged"),
        ("lost", f"series:{lost}:0", "routed", None, "missed"),
        ("lost", f"series:{lost}:1", "deferred", monday, "non_working_day"),
    ]


# --- 5. series identity -----------------------------------------------------------------------------


def test_re_arming_with_another_calendar_policy_is_an_error_naming_the_series(gates_catalog, at):
    register_recipient("ny", timezone=NY)
    first = daily_from_friday()
    assert daily_from_friday().series_id == first.series_id  # the same call: harmless
    assert not daily_from_friday().new
    with pytest.raises(
        SeriesConflict,
        match=r"^series \d+ \(key 'weekly_one_on_one:.*'\) is already armed with calendar_policy 'next_working_day', not 'send'",
    ) as caught:
        arm_series("ny", "weekly_one_on_one", anchor="2026-12-04T09:00", every="1d")
    err = caught.value
    assert err.series_id == first.series_id
    assert err.series_key == "weekly_one_on_one:2026-12-04T09:00:00:1d"
    assert err.differences == {"calendar_policy": ("next_working_day", "send")}
    assert str(err) == (
        f"series {first.series_id} (key 'weekly_one_on_one:2026-12-04T09:00:00:1d') is already "
        "armed with calendar_policy 'next_working_day', not 'send': cancel it and arm again, or "
        "pass another series_key"
    )
    with pytest.raises(SeriesConflict, match="max_count None, not 5; until None, not '2027"):
        daily_from_friday(count=5, until=datetime(2027, 1, 1, tzinfo=UTC))
    assert rows("SELECT count(*), min(calendar_policy), min(max_count) FROM series") == [
        (1, "next_working_day", None)
    ]


def test_the_cli_says_which_series_conflicts(gates_catalog, capsys):
    register_recipient("ny", timezone=NY)
    args = ["arm", "weekly_one_on_one", "--user", "ny", "--anchor", "2026-12-04T09:00"]
    with pytest.raises(SystemExit, match=r"^0$") as done:
        cli.main([*args, "--every", "1d", "--calendar", "skip"])
    assert done.value.code == 0
    with pytest.raises(SystemExit, match=r"^2$") as done:
        cli.main([*args, "--every", "1d"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("clarion: series ") and "calendar_policy 'skip', not 'send'" in err


# --- 4. readable output ---------------------------------------------------------------------------------


def test_dry_run_shows_where_a_moved_occurrence_goes_and_why(gates_catalog, at):
    register_recipient("ny", timezone=NY)
    arm = dict(every="1d", count=4, until=None, variables={}, calendar_policy="next_working_day")
    out = arm_preview("ny", "weekly_one_on_one", anchor="2026-12-04T09:00", **arm)
    lines = out.splitlines()
    saturday = next(line for line in lines if "Sat 2026-12-05" in line)
    assert "merged" in saturday
    assert saturday.rstrip().endswith(
        "moved from Sat 2026-12-05 09:00 to Mon 2026-12-07 09:00 (weekend (US: Sat–Sun)); merged "
        "into occurrence 3 (that day's own occurrence): not sent again"
    )
    weekly = arm_preview(
        "ny", "weekly_one_on_one", anchor="2026-12-05T09:00", **{**arm, "every": "1w"}
    )
    first = next(line for line in weekly.splitlines() if "Sat 2026-12-05" in line)
    assert "moved" in first and first.rstrip().endswith(
        "moved from Sat 2026-12-05 09:00 to Mon 2026-12-07 09:00 (weekend (US: Sat–Sun))"
    )


def test_schedule_lists_a_moved_row_on_its_new_day_with_where_it_came_from(gates_catalog, at):
    register_recipient("ny", timezone=NY)
    at(datetime(2026, 12, 1, tzinfo=UTC))
    arm_series(
        "ny",
        "weekly_one_on_one",
        anchor="2026-12-05T09:00",
        every="1w",
        calendar_policy="next_working_day",
    )
    daily_from_friday()
    out = schedule("ny", 7)
    moved = [line for line in out.splitlines() if "moved from" in line]
    weekly = next(line for line in moved if "#1/0" in line)
    assert weekly.startswith("Mon 2026-12-07 09:00 EST")  # listed on its new day
    assert weekly.rstrip().endswith(
        "moved from Sat 2026-12-05 09:00 to Mon 2026-12-07 09:00 (weekend (US: Sat–Sun))"
    )
    merged = [line for line in moved if "merged" in line]
    assert len(merged) == 2 and all("#2/" in line for line in merged)


# --- 1. one tz database ----------------------------------------------------------------------------------


# A release other than this install's: tzdata is a range, so the installed one is not fixed.
OTHER = "2025b" if zones.TZ_DATABASE != "2025b" else "2024a"


def set_recorded(release: str) -> None:
    with engine().begin() as conn:
        conn.execute(
            text("UPDATE clarion_meta SET value = :v WHERE key = 'tzdata'"), {"v": release}
        )


def test_migrating_records_this_installs_tz_release(gates_catalog):
    assert rows("SELECT key, value FROM clarion_meta") == [("tzdata", zones.TZ_DATABASE)]
    check_tz_database()  # the same release: nothing to say
    assert tz_database(zones.TZ_DATABASE)[1] == (
        "recorded in the database",
        f"{zones.TZ_DATABASE} (the same)",
    )


def test_a_worker_with_another_tz_release_refuses_and_its_tick_fires_nothing(gates_catalog, capsys):
    register_recipient("ny", timezone=NY)
    daily_from_friday()
    set_recorded(OTHER)
    with pytest.raises(
        ConfigurationError,
        match=r"^this install computes times with tz database .* but the database was migrated with ",
    ) as refused:
        check_tz_database()
    assert str(refused.value) == (
        f"this install computes times with tz database {zones.describe()} but the database was "
        f"migrated with {OTHER}: install the tzdata release {OTHER}, or run `clarion migrate` from this "
        f"install to move the whole deployment to {zones.TZ_DATABASE}"
    )
    assert tick(FRIDAY_0905_NY) == 0
    assert rows("SELECT count(*) FROM requests") == [(0,)]
    assert "DIFFERENT" in tz_database(OTHER)[1][1]
    # `clarion migrate` from this install moves the deployment to its release, and says so
    with pytest.raises(SystemExit, match=r"^0$") as done:
        cli.main(["migrate"])
    assert done.value.code == 0
    assert f"tz database is now {zones.describe()} (was {OTHER})" in capsys.readouterr().out
    check_tz_database()
    assert tick(FRIDAY_0905_NY) == 1
