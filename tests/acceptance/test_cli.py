"""The `clarion` command as staff and ops run it: a real subprocess, asserted on its output and exit
code, against a real PostgreSQL database (one per test) and Redis. Recipients, preferences and
routing are set up in this process through the public API; everything else goes through the CLI."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text

from clarion import settings
from clarion.db.engine import engine, one_off_engine
from clarion.scheduling import zones
from clarion.tasks import notify, register_recipient
from clarion.tasks.preferences import set_preferences
from clarion.tasks.route import route
from clarion.tasks.series import arm_series
from clarion.tasks.tick import tick
from tests.support.cli import ok, refused
from tests.support.environment import ROOT

pytestmark = pytest.mark.acceptance

CLARION = Path(sys.executable).parent / "clarion"
GATES = ROOT / "tests" / "catalog_gates.yaml"
ONE_ON_ONE = "weekly_one_on_one"  # window-exempt activation type, no required variables
EXTRA = {"CLARION_CATALOG": str(GATES), "CLARION_WEBHOOK_URL": "http://127.0.0.1:9/hook"}
GATES_SHA256 = hashlib.sha256(GATES.read_bytes()).hexdigest()
NOT_IN = f": not in catalog {GATES} (sha256 {GATES_SHA256[:12]})"  # how UnknownType ends
# A schedule / simulate row: "Sun 2026-12-06 09:00 IST  weekly_one_on_one  #1/0  deliver  why"
ROW = re.compile(
    r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\d{4}-\d\d-\d\d) (\d\d:\d\d) \S+\s+(\S+)\s+#(\d+)/(\d+)\s+"
    r"(\S+)\s*(.*)$"
)


@pytest.fixture
def cli(clarion_env, monkeypatch):
    """`cli("send", ...)` runs the installed `clarion` command against this test's database and the
    gates catalog; this process (register_recipient, route) is pointed at the same catalog."""
    from tests.support.environment import reset_process_state

    for key, value in EXTRA.items():
        monkeypatch.setenv(key, value)
    reset_process_state()
    env = {**os.environ, **clarion_env.env, **EXTRA}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLARION), *args], env=env, capture_output=True, text=True, timeout=120
        )

    return run


def count(table: str) -> int:
    with engine().connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def soon(zone: str, hours: int = 1) -> str:
    """A local wall time about an hour from now in `zone`, to the minute, as --anchor takes it."""
    tz = ZoneInfo(zone)
    wall = (datetime.now(tz) + timedelta(hours=hours)).replace(second=0, microsecond=0, tzinfo=None)
    while wall.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wall:
        wall += timedelta(hours=1)  # inside a spring-forward gap: take a wall time that exists
    return wall.isoformat(timespec="minutes")


# --- send -----------------------------------------------------------------------------------------


def test_send_dry_run_prints_the_plan_gate_by_gate_and_writes_nothing(cli):
    register_recipient("ana", timezone="Europe/Berlin")
    register_recipient("ben", timezone="Europe/Berlin")
    set_preferences("ben", {"type:weekly_one_on_one": False})
    before = {t: count(t) for t in ("requests", "decisions", "deliveries")}

    out = ok(cli("send", ONE_ON_ONE, "--user", "ana", "--dry-run"))
    lines = out.split("\n\n")[0].splitlines()  # the plan; what ana would get follows
    assert lines[0] == "dry run — outcome: deliver on webhook"
    assert lines[1].split() == ["gate", "channel", "decision", "reason", "detail"]
    gates = [line.split()[0] for line in lines[3:]]
    assert gates == ["preferences", "quiet_hours", "activation_window", "fatigue_cap"]
    assert re.search(r"^preferences\s+webhook\s+allow\s+allowed", out, re.M)
    assert re.search(r"^activation_window\s+allow\s+exempt\s+window-exempt type", out, re.M)

    out = ok(cli("send", ONE_ON_ONE, "--user", "ben", "--dry-run"))
    assert out.splitlines()[0] == "dry run — outcome: suppress"
    assert re.search(r"^preferences\s+webhook\s+suppress\s+opted_out", out, re.M)
    assert re.search(r"^channels\s+suppress\s+no_channel", out, re.M)

    assert (
        {t: count(t) for t in before} == before == {"requests": 0, "decisions": 0, "deliveries": 0}
    )


def test_send_enqueues_once_per_event_id(cli):
    register_recipient("ana", timezone="Europe/Berlin")
    first = ok(
        cli("send", "receipt", "--user", "ana", "--var", "order=A-17", "--event-id", "order-17")
    )
    match = re.fullmatch(r"request (\d+) enqueued\n", first)
    assert match, first
    with engine().connect() as conn:
        row = conn.execute(
            text("SELECT id, type_key, occurrence_key, variables FROM requests")
        ).one()
    assert tuple(row) == (int(match[1]), "receipt", "event:order-17", {"order": "A-17"})

    again = ok(
        cli("send", "receipt", "--user", "ana", "--var", "order=A-17", "--event-id", "order-17")
    )
    assert again == f"request {match[1]} already existed; nothing new\n"
    assert count("requests") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("send", "nope", "--user", "ana"), "clarion: unknown notification type 'nope'" + NOT_IN),
        (("send", "receipt", "--user", "ana"), "clarion: type 'receipt' needs variables: order"),
        (
            ("send", "receipt", "--user", "ghost", "--var", "order=1"),
            "clarion: unknown recipient 'ghost'",
        ),
        (
            ("send", "receipt", "--user", "ana", "--var", "order"),
            "clarion: --var takes name=value, not 'order'",
        ),
        (
            (
                "send",
                "receipt",
                "--user",
                "ana",
                "--var",
                "order=1",
                "--event-id",
                "a",
                "--occurrence-key",
                "b",
            ),
            "clarion: occurrence_key: give exactly one of event_id or occurrence_key",
        ),
        (
            ("send", "receipt", "--user", "ghost", "--var", "order=1", "--dry-run"),
            "clarion: unknown recipient 'ghost'",
        ),
        (
            ("arm", "nope", "--user", "ana", "--anchor", "2026-12-06T09:00", "--every", "1d"),
            "clarion: unknown notification type 'nope'" + NOT_IN,
        ),
        (
            (
                "arm",
                "tip",
                "--user",
                "ana",
                "--anchor",
                "2026-12-06T09:00",
                "--every",
                "1d",
                "--dry-run",
            ),
            "clarion: type 'tip' needs variables: n",
        ),
        (
            ("arm", ONE_ON_ONE, "--user", "ghost", "--anchor", "2026-12-06T09:00", "--every", "1d"),
            "clarion: unknown recipient 'ghost'",
        ),
        (
            ("arm", ONE_ON_ONE, "--user", "ana", "--anchor", "next tuesday", "--every", "1d"),
            "clarion: anchor: must be an ISO date-time like 2026-12-07T09:00, not 'next tuesday'",
        ),
        (
            ("arm", ONE_ON_ONE, "--user", "ana", "--anchor", "2026-12-06T09:00", "--every", "1x"),
            None,
        ),
        (
            (
                "arm",
                ONE_ON_ONE,
                "--user",
                "ana",
                "--anchor",
                "2026-12-06T09:00",
                "--every",
                "1d",
                "--count",
                "0",
            ),
            "clarion: count: must be a whole number from 1 to 100000, not 0",
        ),
        (
            (
                "arm",
                ONE_ON_ONE,
                "--user",
                "ana",
                "--anchor",
                "2026-12-06T09:00",
                "--every",
                "1d",
                "--until",
                "2026-12-31T00:00",
            ),
            "clarion: until: must be timezone-aware",
        ),
        (("explain", "--user", "ghost"), "clarion: unknown recipient 'ghost'"),
        (("explain", "--user", "ana", "--since", "yesterday"), None),
        (("schedule", "--user", "ghost"), "clarion: unknown recipient 'ghost'"),
        (("simulate", "--user", "ghost"), "clarion: unknown recipient 'ghost'"),
        # Bad calls that once ended in a traceback.
        pytest.param(
            (
                "arm",
                ONE_ON_ONE,
                "--user",
                "ana",
                "--anchor",
                "2026-12-06T09:00",
                "--every",
                "1d",
                "--until",
                "end of year",
            ),
            None,
        ),
        pytest.param(
            (
                "arm",
                ONE_ON_ONE,
                "--user",
                "ana",
                "--anchor",
                "2026-12-06T09:00",
                "--every",
                "3000000d",
                "--dry-run",
            ),
            None,
        ),
        pytest.param(
            (
                "send",
                "receipt",
                "--user",
                "ana",
                "--var",
                "order=1",
                "--event-id",
                "e" + secrets.token_hex(1500),
            ),
            None,
        ),
        pytest.param(("explain", "--user", "ana", "--limit", "-1"), None),
    ],
    ids=[
        "send-unknown-type",
        "send-missing-var",
        "send-unknown-user",
        "send-var-without-equals",
        "send-event-and-occurrence",
        "send-dry-run-unknown-user",
        "arm-unknown-type",
        "arm-missing-var",
        "arm-unknown-user",
        "arm-bad-anchor",
        "arm-bad-every",
        "arm-count-0",
        "arm-naive-until",
        "explain-unknown-user",
        "explain-bad-since",
        "schedule-unknown-user",
        "simulate-unknown-user",
        "arm-bad-until",
        "arm-interval-past-9999",
        "send-event-id-too-long",
        "explain-negative-limit",
    ],
)
def test_a_bad_call_exits_2_with_one_line_and_writes_nothing(cli, args, message):
    register_recipient("ana", timezone="Europe/Berlin")
    line = refused(cli(*args))
    if message is not None:
        assert line == message
    assert (count("requests"), count("series")) == (0, 0)


def test_an_empty_event_id_is_refused_not_replaced_by_a_random_one(cli):
    register_recipient("ana", timezone="Europe/Berlin")
    results = [
        cli("send", "receipt", "--user", "ana", "--var", "order=1", "--event-id", "")
        for _ in range(2)
    ]
    assert count("requests") == 0, (
        f"{count('requests')} requests written: {[r.stdout for r in results]}"
    )
    refused(results[0])


# --- series: arm, schedule, simulate -----------------------------------------------------------


def test_arm_dry_run_shows_the_first_occurrences_in_local_time_with_the_calendar(cli):
    register_recipient("dana", timezone="Asia/Jerusalem")  # no country set: IL from the zone
    out = ok(
        cli(
            "arm",
            ONE_ON_ONE,
            "--user",
            "dana",
            "--anchor",
            "2026-12-06T09:00",
            "--every",
            "1d",
            "--calendar",
            "skip",
            "--dry-run",
        )
    )
    lines = out.splitlines()
    assert lines[0].startswith(
        "dry run — weekly_one_on_one for dana every 1d from 2026-12-06 09:00:00 "
        "Asia/Jerusalem (calendar: IL, the country of zone Asia/Jerusalem"
    )
    assert lines[0].endswith("non-working days: skip)")
    rows = [line.split(None, 6) for line in lines[3:]]
    assert [int(r[0]) for r in rows] == list(range(10))
    for _n, day, _date, hhmm, zone, utc, *rest in rows:
        assert (hhmm, zone) == ("09:00", "IST"), out  # 09:00 local, 07:00 UTC in winter
        assert utc.startswith("2026-12-") and rest[0].startswith("07:00 UTC"), out
        verdict = rest[0].split()[2]
        if day in ("Fri", "Sat"):
            assert verdict == "skipped" and "weekend (IL: Fri–Sat)" in rest[0], out
        else:
            assert verdict == "send", out
    assert [r[1] for r in rows][:7] == ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    assert count("series") == 0


def test_arm_then_schedule_lists_the_coming_occurrences_with_outcomes(cli):
    register_recipient("dana", timezone="Asia/Jerusalem")
    anchor = soon("Asia/Jerusalem")
    out = ok(
        cli(
            "arm",
            ONE_ON_ONE,
            "--user",
            "dana",
            "--anchor",
            anchor,
            "--every",
            "1d",
            "--calendar",
            "skip",
            "--key",
            "standup",
        )
    )
    match = re.fullmatch(r"series (\d+) armed; first occurrence due (\S+)\n", out)
    assert match, out
    series_id = int(match[1])
    due = datetime.fromisoformat(match[2])
    assert (
        due.astimezone(ZoneInfo("Asia/Jerusalem"))
        .replace(tzinfo=None)
        .isoformat(timespec="minutes")
        == anchor
    )
    again = ok(
        cli(
            "arm",
            ONE_ON_ONE,
            "--user",
            "dana",
            "--anchor",
            anchor,
            "--every",
            "1d",
            "--calendar",
            "skip",
            "--key",
            "standup",
        )
    )
    assert again.startswith(f"series {series_id} was armed already")
    assert count("series") == 1

    out = ok(cli("schedule", "--user", "dana", "--days", "14"))
    assert out.splitlines()[0] == "schedule for dana, next 14 days (Asia/Jerusalem)"
    rows = [m.groups() for m in map(ROW.match, out.splitlines()) if m]
    assert [int(r[5]) for r in rows] == list(range(14)), out  # today+1h, then 13 more days
    for day, _date, hhmm, type_key, sid, _n, outcome, why in rows:
        assert (type_key, int(sid), hhmm) == (ONE_ON_ONE, series_id, anchor[11:16])
        if day in ("Fri", "Sat"):
            assert (outcome, why) == ("skipped", "weekend (IL: Fri–Sat)"), out
        else:
            assert outcome == "deliver" or (outcome == "skipped" and why.startswith("holiday: ")), (
                out
            )
    assert {r[0] for r in rows} == {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}
    assert count("requests") == 0  # a schedule is a forecast, not a send


def test_simulate_a_year_counts_every_occurrence_of_the_recipients_series(cli):
    register_recipient("sam", timezone="UTC")  # no country: a Mon–Fri week, no holidays
    anchor = soon("UTC")
    ok(
        cli(
            "arm",
            ONE_ON_ONE,
            "--user",
            "sam",
            "--anchor",
            anchor,
            "--every",
            "1d",
            "--calendar",
            "skip",
        )
    )
    ok(
        cli(
            "arm",
            ONE_ON_ONE,
            "--user",
            "sam",
            "--anchor",
            anchor,
            "--every",
            "1w",
            "--calendar",
            "send",
        )
    )
    start = datetime.fromisoformat(anchor)
    daily = [start + timedelta(days=k) for k in range(365)]  # all inside [now, now + 365 days)
    weekly = [start + timedelta(weeks=k) for k in range(53)]
    weekend = sum(1 for d in daily if d.weekday() >= 5)

    out = ok(cli("simulate", "--user", "sam", "--days", "365"))
    summary, first = out.split("\n\n")
    assert summary.splitlines()[0] == (
        f"simulation for sam: 365 days, {len(daily) + len(weekly)} occurrences, virtual clock"
    )
    table = {}
    for line in summary.splitlines()[3:]:
        cells = re.split(r"\s{2,}", line.strip())
        table[tuple(cells[1:-1])] = int(cells[-1])
    assert table == {
        ("deliver",): len(daily) + len(weekly) - weekend,
        ("skipped", "weekend (no country: Sat–Sun)"): weekend,
    }, summary
    assert sum(table.values()) == 418
    assert first.splitlines()[0] == "first 30 occurrences"
    assert count("requests") == 0


# --- explain, stats, migrate ---------------------------------------------------------------------


def test_explain_shows_why_an_opted_out_request_was_not_sent(cli):
    register_recipient("olga", timezone="Europe/Berlin")
    set_preferences("olga", {"type:weekly_one_on_one": False})
    request = notify("olga", ONE_ON_ONE, event_id="1on1-2026-12-07")
    assert route(["olga"], [request.request_id]) == 1  # in this process, as a lane worker would

    out = ok(cli("explain", "--user", "olga"))
    title = out.splitlines()[0]
    assert title.startswith(
        f"request {request.request_id}  weekly_one_on_one  (event:1on1-2026-12-07)  requested "
    )
    assert title.endswith(" — not sent: opted_out")
    assert re.search(
        r"^decided\s+\S+ \S+\s+preferences\s+suppress\s+opted_out\s+webhook\s+recipient setting: "
        r"type weekly_one_on_one",
        out,
        re.M,
    ), out
    assert re.search(r"^decided\s+\S+ \S+\s+channels\s+suppress\s+no_channel", out, re.M), out
    assert count("deliveries") == 0

    assert ok(cli("explain", "--user", "olga", "--type", "receipt")) == (
        "No requests for olga of type receipt in that period.\n"
    )


def test_stats_prints_its_sections(cli):
    register_recipient("olga", timezone="Europe/Berlin")
    set_preferences("olga", {"type:weekly_one_on_one": False})
    request = notify("olga", ONE_ON_ONE, event_id="e1")
    route(["olga"], [request.request_id])
    with engine().begin() as conn:  # an open digest window and a waiting escalation chain
        conn.execute(
            text(
                "INSERT INTO digests (user_id, digest_type, digest_key, state, opened_at, due_at,"
                " max_items, count, items) VALUES ('olga', 'replies', 'k', 'open', now(),"
                " '2030-01-02 08:00+00', 50, 3, '[]')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO escalations (user_id, request_id, type_key, steps, next_step, due_at,"
                " created_at, updated_at) VALUES ('olga', :r, 'page', '[]', 2,"
                " '2030-01-02 09:05+00', now(), now())"
            ),
            {"r": request.request_id},
        )
    out = ok(cli("stats"))
    titles = [block.splitlines()[0] for block in out.split("\n\n")]
    assert titles == [
        "Catalog",
        "Requests",
        "Deliveries",
        "Not delivered, with the recorded reason",
        "Incidents",
        "Digests",
        "Escalation chains",
        "Alerts (open, and cleared in the last day)",
        "Time zone rules",
        "Work found already done (duplicates prevented)",
        "Broker queues",
    ]
    assert re.search(rf"^{GATES}\s+{GATES_SHA256}\s+11$", out, re.M), out  # path, sha256, types
    assert re.search(r"^activation\s+routed\s+1$", out, re.M), out
    assert re.search(rf"^recorded in the database\s+{zones.TZ_DATABASE} \(the same\)$", out, re.M)
    assert re.search(r"^preferences\s+suppress\s+opted_out\s+1$", out, re.M), out
    assert re.search(r"^replies\s+open\s+1\s+3\s+2030-01-02 08:00:00$", out, re.M), out
    assert re.search(r"^page\s+waiting\s+2\s+1\s+2030-01-02 09:05:00$", out, re.M), out
    # notify() published one route task to the activation lane and no worker runs here: the queue
    # shows it, whether or not its key exists yet (an empty Redis queue has none)
    assert re.search(r"^activation\s+1\s+(\?|0)$", out, re.M), out
    assert re.search(r"^transactional\s+0\s+(\?|0)$", out, re.M), out


def test_migrate_on_a_migrated_database_succeeds_and_changes_nothing(cli):
    with engine().connect() as conn:
        revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    for _ in range(2):
        assert ok(cli("migrate")) == (
            f"database is at the latest revision\ntz database: {zones.describe()}\n"
        )
    with engine().connect() as conn:
        assert (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == revision
        )


def test_migrate_down_removes_clarions_schema_and_migrate_brings_it_back(cli):
    engine().dispose()
    out = ok(cli("migrate", "--down"))
    assert out == "removed clarion's tables and schema clarion; nothing else touched\n"
    with one_off_engine(settings.get().urls()[0]).connect() as conn:
        assert conn.execute(text("SELECT to_regnamespace('clarion')")).scalar() is None
    assert ok(cli("migrate")).startswith("database is at the latest revision\n")
    engine().dispose()
    with engine().connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM requests")).scalar_one() == 0


# --- a series the CLI should not have armed ----------------------------------------------------


def test_one_series_with_an_absurd_interval_does_not_stop_every_other_series(cli):
    register_recipient("pat", timezone="UTC")
    register_recipient("quinn", timezone="UTC")
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    armed = cli(
        "arm",
        ONE_ON_ONE,
        "--user",
        "pat",
        "--anchor",
        (now - timedelta(minutes=2)).isoformat(),
        "--every",
        "3000000d",
    )
    assert "Traceback" not in armed.stderr
    arm_series("quinn", ONE_ON_ONE, anchor=now - timedelta(minutes=1), every="1d")
    try:
        tick()  # the beat tick task, run in this process
    except OverflowError as exc:
        pytest.fail(
            f"the tick died with {exc!r} (arm exited {armed.returncode}: {armed.stdout.strip()})"
        )
    with engine().connect() as conn:
        fired = conn.execute(
            text("SELECT count(*) FROM requests WHERE user_id = 'quinn'")
        ).scalar_one()
    assert fired == 1


# --- an unmigrated database -----------------------------------------------------------------------


@pytest.fixture
def unmigrated(clarion_env, unmigrated_database) -> dict[str, str]:
    """The CLI's environment, its database a new one that was never migrated."""
    return {**os.environ, **clarion_env.env, **EXTRA, "CLARION_DATABASE_URL": unmigrated_database}


UNMIGRATED = {
    "send": ["send", "receipt", "--user", "ana", "--var", "order=1"],
    "send --dry-run": ["send", "receipt", "--user", "ana", "--var", "order=1", "--dry-run"],
    "arm": ["arm", ONE_ON_ONE, "--user", "ana", "--anchor", "2030-01-07T09:00", "--every", "1w"],
    "explain": ["explain", "--user", "ana"],
    "schedule": ["schedule", "--user", "ana"],
    "redrive": ["redrive", "--dry-run"],
    "link": ["link", "--user", "ana"],
    "keys create": ["keys", "create", "--name", "billing", "--scope", "events:write"],
    "stats": ["stats"],
    "suppressions list": ["suppressions", "list"],
    "suppressions lift": [
        "suppressions",
        "lift",
        "--user",
        "ana",
        "--channel",
        "email",
        "--address",
        "a@b.c",
        "--reason",
        "why",
    ],
}


@pytest.mark.parametrize("args", UNMIGRATED.values(), ids=UNMIGRATED.keys())
def test_a_command_on_an_unmigrated_database_says_so_in_one_line(unmigrated, args):
    """Each says what to do, in one line, instead of an SQL traceback about a missing table."""
    result = subprocess.run(
        [str(CLARION), *args], env=unmigrated, capture_output=True, text=True, timeout=120
    )
    line = refused(result)
    assert "not migrated" in line and line.endswith("run `clarion migrate`"), line
