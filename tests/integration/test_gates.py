"""The ordered gates against real PostgreSQL, driven in-process with an injected clock.

- the dry run (tasks.planning.preview) equals what notify() + route() then record, decision by
  decision, over random recipients, settings, prior state and times (a hypothesis property);
- an exempt daily series is neither blocked by the activation window nor holds it open;
- explain() answers "why not?" for an opt-out, quiet hours, the window and a fatigue cap;
- suppression list, collapse, critical and locked types, jurisdiction defaults, org caps;
- the preferences API: the resolved matrix with its rules, and rejected settings writing nothing.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sqlalchemy import text

from clarion import settings
from clarion.db import fatigue_counters, gating
from clarion.db.engine import engine
from clarion.errors import InvalidRequest, UnknownRecipient
from clarion.ops.explain import explain, plan_table
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, notify_many, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.planning import preview
from clarion.tasks.preferences import get_preferences, set_preferences
from clarion.tasks.route import route
from clarion.tasks.series import arm_series, fire_due_series
from clarion.tasks.tick import tick
from tests.support.gates import (
    VirtualClock,
    decisions_of,
    deliveries_of,
    fresh_event,
    gate_state,
    one,
    request_row,
    rows,
    send_and_route,
    summaries,
    use_gates_catalog,
)
from tests.support.pipeline import configure
from tests.support.race import held, race

pytestmark = pytest.mark.integration

MONDAY = datetime(2026, 12, 7, 7, 0, tzinfo=UTC)  # 08:00 in Berlin


@pytest.fixture
def gates(clarion_env, monkeypatch):
    use_gates_catalog(monkeypatch)
    return clarion_env


@pytest.fixture
def vclock() -> Iterator[VirtualClock]:
    c = VirtualClock(MONDAY)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def receiver(gates, monkeypatch) -> Iterator[Receiver]:
    """The real webhook receiver as the default webhook URL (every gate-catalog type uses webhook)."""
    with Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        yield running


def _route_pending() -> int:
    pending = rows("SELECT user_id, id FROM requests WHERE state = 'pending' ORDER BY id")
    return route([u for u, _ in pending], [i for _, i in pending]) if pending else 0


def _deliver_pending() -> int:
    pending = rows("SELECT user_id, id FROM deliveries WHERE state = 'pending' ORDER BY id")
    return deliver([u for u, _ in pending], [i for _, i in pending]) if pending else 0


def _sent(user: str, request_id: int) -> bool:
    return [s for _, _, s in deliveries_of(user, request_id)] == ["sent"]


def _reasons(user: str, request_id: int) -> list[str]:
    return [reason for _, _, reason, _, _ in decisions_of(user, request_id)]


# --- 1. the dry run equals the real send (property) ---------------------------------------------

ZONES = (
    "Pacific/Auckland",
    "Asia/Tokyo",
    "Asia/Kolkata",
    "Europe/Berlin",
    "Europe/London",
    "UTC",
    "America/Sao_Paulo",
    "America/New_York",
    "America/Los_Angeles",
    "Pacific/Honolulu",
)
QUIET = (None, ("22:00", "07:00"), ("23:30", "00:30"), ("00:00", "06:00"), ("09:00", "17:30"))
VARIABLES: dict[str, dict[str, Any]] = {
    "kickoff": {},
    "stalled_plan": {},
    "goal_prompt": {},
    "weekly_one_on_one": {},
    "tip": {"n": 1},
    "promo": {},
    "cpu_alert": {"host": "h1", "cluster": "c1"},
    "outage": {},
    "receipt": {"order": "o-1"},
    "security_code": {"code": "123456"},
    "daily_summary": {"count": 2},
}
OPTIONAL = (
    "all",
    "category:activation",
    "category:digest",
    "category:marketing",
    "category:alert",
    "type:kickoff",
    "type:stalled_plan",
    "type:goal_prompt",
    "type:weekly_one_on_one",
    "type:tip",
    "type:promo",
    "type:cpu_alert",
    "type:outage",
)
LOCKED = ("category:transactional", "category:security", "type:receipt", "type:security_code")
SUFFIXES = ("", "/webhook", "/console")
# Instants around DST changes on both sides of UTC (Europe, the US, New Zealand, Brazil has none).
DST_EDGES = (
    datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    datetime(2026, 10, 25, 1, 0, tzinfo=UTC),
    datetime(2026, 3, 8, 10, 0, tzinfo=UTC),
    datetime(2026, 11, 1, 9, 0, tzinfo=UTC),
    datetime(2026, 4, 4, 14, 0, tzinfo=UTC),
    datetime(2026, 9, 26, 14, 0, tzinfo=UTC),
)


@dataclass(frozen=True)
class Case:
    zone: str
    country: str | None
    quiet: tuple[str, str] | None
    org: bool
    settings: dict[str, bool]
    type_key: str
    cluster: str  # for cpu_alert
    at: datetime
    window_hours_ago: float | None  # a kickoff routed that long before `at`
    capped_before: int  # tips routed before `at` ...
    capped_minutes_ago: int  # ... this long before
    collapse_seconds_ago: int | None  # a cpu_alert on cluster c1 routed that long before
    suppressed: str | None  # a channel whose address is on the suppression list


def _settings_strategy() -> st.SearchStrategy[dict[str, bool]]:
    optional = st.dictionaries(
        st.tuples(st.sampled_from(OPTIONAL), st.sampled_from(SUFFIXES)).map("".join),
        st.booleans(),
        max_size=4,
    )
    locked_on = st.dictionaries(
        st.tuples(st.sampled_from(LOCKED), st.sampled_from(SUFFIXES)).map("".join),
        st.just(True),
        max_size=1,
    )  # turning a locked type off is an error
    return st.builds(lambda a, b: {**a, **b}, optional, locked_on)


_instants = st.one_of(
    st.datetimes(
        min_value=datetime(2026, 1, 1), max_value=datetime(2026, 12, 31), timezones=st.just(UTC)
    ),
    st.builds(
        lambda edge, s: edge + timedelta(seconds=s),
        st.sampled_from(DST_EDGES),
        st.integers(-3 * 3600, 3 * 3600),
    ),
)

CASES = st.builds(
    Case,
    zone=st.sampled_from(ZONES),
    country=st.sampled_from((None, "US", "DE")),
    quiet=st.sampled_from(QUIET),
    org=st.booleans(),
    settings=_settings_strategy(),
    type_key=st.sampled_from(sorted(VARIABLES)),
    cluster=st.sampled_from(("c1", "c2")),
    at=_instants,
    window_hours_ago=st.sampled_from((None, 1.0, 47.5, 48.5, 72.0)),
    capped_before=st.integers(0, 4),
    capped_minutes_ago=st.sampled_from((0, 45, 20 * 60)),
    collapse_seconds_ago=st.sampled_from((None, 5, 119, 121)),
    suppressed=st.sampled_from((None, None, "webhook", "console")),
)

_BASE = Case(
    type_key="receipt",  # every example names its own
    zone="Europe/Berlin",
    country=None,
    quiet=None,
    org=False,
    settings={},
    cluster="c1",
    at=datetime(2026, 12, 7, 12, 0, tzinfo=UTC),
    window_hours_ago=None,
    capped_before=0,
    capped_minutes_ago=0,
    collapse_seconds_ago=None,
    suppressed=None,
)
# Every outcome at least once, whatever hypothesis draws.
EXAMPLES = [
    replace(_BASE, type_key="cpu_alert", collapse_seconds_ago=5),  # collapse
    replace(_BASE, type_key="tip", capped_before=3, org=True),  # fold
    replace(_BASE, type_key="stalled_plan", window_hours_ago=1.0),  # window: skip
    replace(_BASE, type_key="goal_prompt", window_hours_ago=47.5),  # window: defer
    replace(_BASE, type_key="kickoff", quiet=("09:00", "17:30")),  # quiet hours
    replace(_BASE, type_key="promo", country="US", settings={"all/console": False}),
    replace(
        _BASE,
        type_key="promo",
        suppressed="webhook",
        settings={"category:marketing": True},
    ),
    replace(
        _BASE,
        type_key="security_code",
        settings={"all": False},
        quiet=("09:00", "17:30"),
    ),
]


def _establish_prior_state(uid: str, case: Case, clock: VirtualClock) -> None:
    """What happened before `at`, routed for real at its own (virtual) time, before quiet hours
    and settings are in force."""
    events: list[tuple[datetime, str, dict[str, Any]]] = []
    if case.window_hours_ago is not None:
        events.append((case.at - timedelta(hours=case.window_hours_ago), "kickoff", {}))
    for n in range(case.capped_before):
        events.append(
            (case.at - timedelta(minutes=case.capped_minutes_ago, seconds=n), "tip", {"n": n})
        )
    if case.collapse_seconds_ago is not None:
        events.append(
            (
                case.at - timedelta(seconds=case.collapse_seconds_ago),
                "cpu_alert",
                {"host": "h0", "cluster": "c1"},
            )
        )
    for when, type_key, variables in sorted(events, key=lambda e: e[0]):
        clock.set(when)
        send_and_route(uid, type_key, variables)


def _recipient(uid: str, case: Case, *, quiet: bool) -> None:
    register_recipient(
        uid,
        timezone=case.zone,
        country=case.country,
        org_id=f"org-{uid}" if case.org else None,
        quiet_hours=case.quiet if quiet else None,
    )


def test_the_dry_run_equals_what_the_real_send_records(gates, receiver):
    """Invariant 5: preview() and notify()+route() run the same gates over the same state.

    The route sends what it routes itself; the receiver takes the webhook sends, so the only
    decisions recorded are the gates' (a send that failed would add a deliver decision)."""
    ids = itertools.count()
    outcomes: set[str] = set()
    clock = VirtualClock(MONDAY)

    @hsettings(
        max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(case=CASES)
    @example(case=EXAMPLES[0])
    @example(case=EXAMPLES[1])
    @example(case=EXAMPLES[2])
    @example(case=EXAMPLES[3])
    @example(case=EXAMPLES[4])
    @example(case=EXAMPLES[5])
    @example(case=EXAMPLES[6])
    @example(case=EXAMPLES[7])
    def check(case: Case) -> None:
        uid = f"p{next(ids)}"
        note(f"recipient {uid}")
        clock.set(case.at - timedelta(days=4))
        _recipient(uid, case, quiet=False)
        _establish_prior_state(uid, case, clock)
        clock.set(case.at)
        _recipient(uid, case, quiet=True)
        if case.suppressed:
            with engine().begin() as conn:
                gating.suppress_address(
                    conn,
                    uid,
                    channel=case.suppressed,
                    address=uid,
                    reason="bounced",
                    detail="hard bounce",
                    now=case.at,
                )
        set_preferences(uid, case.settings)
        event, variables = fresh_event(), {**VARIABLES[case.type_key]}
        if case.type_key == "cpu_alert":
            variables["cluster"] = case.cluster

        before = gate_state()
        planned = preview(uid, case.type_key, event_id=event, variables=variables)
        assert gate_state() == before, "the dry run wrote something"
        request_id = notify(uid, case.type_key, event_id=event, variables=variables).request_id
        assert route([uid], [request_id]) == 1
        note(plan_table(planned))

        expected = [(s.gate, s.outcome, s.reason, s.channel, s.detail) for s in planned.decisions]
        assert decisions_of(uid, request_id) == expected
        assert [(c, nb) for c, nb, _ in deliveries_of(uid, request_id)] == sorted(
            (c, nb or case.at) for c, nb in planned.channels
        )
        # the route sent every delivery not held back; a held one waits for the tick
        assert [s for _, nb, s in deliveries_of(uid, request_id)] == [
            "pending" if nb > case.at else "sent" for _, nb, _ in deliveries_of(uid, request_id)
        ]
        request = request_row(uid, request_id)
        if planned.defer_until is not None:
            assert (request["state"], request["due_at"]) == ("deferred", planned.defer_until)
        else:
            assert request["state"] == "routed"
        if planned.fold is not None:
            [summary] = [
                s for s in summaries(uid) if s["occurrence_key"] == planned.fold.occurrence_key
            ]
            assert (summary["state"], summary["due_at"]) == ("deferred", planned.fold.due_at)
            assert case.type_key in summary["variables"]["types"]
        outcomes.add(planned.outcome)

    try:
        check()
    finally:
        clock.close()
    assert {"deliver", "suppress", "defer", "fold", "collapse"} <= outcomes


# --- 2. the window under real concurrent processes (the acceptance tier has the full run) -------


def _route_batch(users: list[str], ids: list[int]) -> int:
    return route(users, ids)


def test_eight_processes_routing_different_nudges_of_one_recipient_send_exactly_one(
    gates, receiver
):
    users = [f"u{n}" for n in range(25)]
    for user in users:
        register_recipient(user, timezone="America/New_York")
    kinds = ["kickoff", "stalled_plan"] * 4
    made = notify_many(
        [
            dict(user_id=u, type_key=k, event_id=f"{u}-{i}")
            for i, k in enumerate(kinds)
            for u in users
        ]
    )
    batches = [made[i * len(users) : (i + 1) * len(users)] for i in range(len(kinds))]
    # u0's window is held (an uncommitted row, rolled back) until all eight routes queue on it
    lock = "INSERT INTO activation_windows VALUES ('u0', 0, 'held', now(), now())"
    with held(lock, {}, waiters=8) as queued:
        routed = race(8, _route_batch, lambda i: (users, [e.request_id for e in batches[i]]))
    assert queued.waiters == 8 and queued.all_in("INSERT INTO activation_windows"), (
        queued.statements
    )
    assert sum(routed) == len(users) * len(kinds)
    assert rows("SELECT user_id, count(*) FROM deliveries GROUP BY 1 HAVING count(*) <> 1") == []
    assert one("SELECT count(*) FROM deliveries") == len(users)
    assert rows("SELECT reason, count(*) FROM decisions GROUP BY 1") == [
        ("activation_window", len(users) * (len(kinds) - 1))
    ]
    # the routes sent them, in their processes: one arrival per recipient
    assert rows("SELECT state, count(*) FROM deliveries GROUP BY 1") == [("sent", len(users))]
    assert sorted(o.split("/")[0] for o in receiver.arrivals.occurrences) == sorted(users)
    assert (receiver.arrivals.total, receiver.arrivals.unique) == (len(users), len(users))
    # the window names the request that was sent
    assert (
        rows(
            "SELECT w.user_id FROM activation_windows w LEFT JOIN deliveries d "
            "ON d.user_id = w.user_id AND d.request_id = w.request_id WHERE d.id IS NULL"
        )
        == []
    )


def _route_or_error(users: list[str], ids: list[int]) -> int | str:
    try:
        return route(users, ids)
    except Exception as exc:  # reported by the assertion, not raised in the child
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def _release_when_waiting(holder, waiters: int) -> None:
    """Roll back `holder` (which holds a row lock) once `waiters` backends queue behind it."""
    deadline = time.monotonic() + 30
    with engine().connect() as conn:
        while (
            time.monotonic() < deadline
            and conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
            < waiters
        ):
            conn.rollback()
            time.sleep(0.01)
    holder.rollback()


def test_two_route_batches_over_one_organisation_in_opposite_orders_both_route(gates, vclock):
    for user in ("oa", "ob"):
        register_recipient(user, timezone="UTC", org_id="acme")
    batches = [
        (
            users,
            [
                e.request_id
                for e in notify_many(
                    [
                        dict(user_id=u, type_key="tip", event_id=f"{n}-{u}", variables={"n": n})
                        for u in users
                    ]
                )
            ],
        )
        for n, users in enumerate((["oa", "ob"], ["ob", "oa"]))
    ]
    with engine().begin() as conn:  # the organisation's counter for this hour exists ...
        fatigue_counters.claim_cap(
            conn,
            scope="org:acme",
            bucket="2026-12-07T07",
            limit=50,
            expires_at=MONDAY + timedelta(hours=1),
        )
    holder = engine().connect()
    holder.execute(text("SELECT 1 FROM fatigue_counters WHERE scope = 'org:acme' FOR UPDATE"))
    # ... and is held until each batch has claimed its first member's cap and waits for it
    releaser = threading.Thread(target=_release_when_waiting, args=(holder, 2))
    releaser.start()
    try:
        routed = race(2, _route_or_error, lambda i: batches[i])
    finally:
        releaser.join()
        holder.close()
    assert routed == [2, 2]


# --- 3. an exempt daily series and the window ---------------------------------------------------


def test_an_exempt_daily_series_neither_is_blocked_by_nor_holds_the_window(gates, vclock, receiver):
    register_recipient("ann", timezone="Europe/Berlin")
    series = arm_series("ann", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1d").series_id
    kickoff_at = datetime(2026, 12, 7, 8, 10, tzinfo=UTC)  # 09:10 local, after the day's 1:1
    # Each nudge 49 hours after the last one sent goes; one a day after a sent one is blocked.
    nudges = {kickoff_at: ("kickoff", True)}
    sent_at = kickoff_at
    while sent_at + timedelta(hours=49) < MONDAY + timedelta(days=10):
        nudges[sent_at + timedelta(hours=24)] = ("stalled_plan", False)
        sent_at += timedelta(hours=49)
        nudges[sent_at] = ("stalled_plan", True)
    ticks = {MONDAY + timedelta(days=d, hours=1, minutes=5): None for d in range(10)}  # 09:05 local
    outcome: dict[datetime, int] = {}
    for when in sorted({**ticks, **nudges}):
        vclock.set(when)
        if when in ticks:
            with engine().begin() as conn:
                assert fire_due_series(conn, now=when).series == 1
            window_before = rows("SELECT type_key, until FROM activation_windows")
            assert _route_pending() == 1
            # the 1:1 neither opens nor extends the window
            assert rows("SELECT type_key, until FROM activation_windows") == window_before
        else:
            outcome[when] = send_and_route("ann", nudges[when][0])
        assert _deliver_pending() == 0  # each route sent what it routed

    one_on_ones = rows(
        "SELECT id, occurrence_key FROM requests WHERE type_key = 'weekly_one_on_one' ORDER BY id"
    )
    assert [k for _, k in one_on_ones] == [f"series:{series}:{n}" for n in range(10)]
    for request_id, _ in one_on_ones:
        assert _sent("ann", request_id) and decisions_of("ann", request_id) == []
    for when, (type_key, goes) in nudges.items():
        request_id = outcome[when]
        if goes:
            assert _sent("ann", request_id), f"{type_key} at {when} was not sent"
        else:
            assert deliveries_of("ann", request_id) == []
            assert _reasons("ann", request_id) == ["activation_window"], when
    arrivals = receiver.arrivals.occurrences
    assert sum(1 for o in arrivals if "/weekly_one_on_one/" in o) == 10
    assert sum(1 for o in arrivals if "/stalled_plan/" in o or "/kickoff/" in o) == sum(
        goes for _, goes in nudges.values()
    )
    assert sum(goes for _, goes in nudges.values()) >= 4


def test_a_deferring_nudge_blocked_by_the_window_comes_back_through_the_tick(
    gates, vclock, receiver
):
    register_recipient("bea", timezone="Asia/Kolkata")
    send_and_route("bea", "kickoff")
    vclock.advance(hours=30)
    prompt = send_and_route("bea", "goal_prompt")
    [(gate, outcome, reason, _, detail)] = decisions_of("bea", prompt)
    assert (gate, outcome, reason) == ("activation_window", "defer", "activation_window")
    assert request_row("bea", prompt)["due_at"] == MONDAY + timedelta(hours=48)
    vclock.advance(hours=17, minutes=59)
    tick()
    assert _route_pending() == 0  # not due yet
    vclock.set(MONDAY + timedelta(hours=48))
    tick()
    assert _route_pending() == 1  # and that route sent it
    assert [s for _, _, s in deliveries_of("bea", prompt)] == ["sent"]
    assert sum(1 for o in receiver.arrivals.occurrences if o.startswith("bea/goal_prompt/")) == 1
    assert rows("SELECT type_key, until FROM activation_windows") == [
        ("goal_prompt", MONDAY + timedelta(hours=96))
    ]


def test_quiet_hours_defer_to_the_end_of_the_window_and_the_tick_sends_then(
    gates, vclock, receiver
):
    register_recipient("cy", timezone="America/Los_Angeles", quiet_hours=("22:00", "07:00"))
    vclock.set(datetime(2026, 12, 8, 6, 30, tzinfo=UTC))  # 22:30 local on the 7th
    nudge = send_and_route("cy", "kickoff")
    end = datetime(2026, 12, 8, 15, 0, tzinfo=UTC)  # 07:00 local on the 8th
    assert request_row("cy", nudge)["due_at"] == end
    assert rows("SELECT count(*) FROM activation_windows") == [
        (0,)
    ]  # a deferred nudge holds no window
    vclock.set(end)
    tick()
    assert receiver.arrivals.total == 0  # nothing went out in quiet hours
    assert _route_pending() == 1  # and that route sent it
    assert deliveries_of("cy", nudge) == [("webhook", end, "sent")]
    assert [o.split("/")[:2] for o in receiver.arrivals.occurrences] == [["cy", "kickoff"]]


# --- 4. explain ---------------------------------------------------------------------------------


def test_explain_answers_why_for_an_opt_out_quiet_hours_the_window_and_a_cap(gates, vclock):
    for user in ("out", "blocked", "capped"):
        register_recipient(user, timezone="Europe/Berlin")
    register_recipient("night", timezone="Europe/Berlin", quiet_hours=("22:00", "07:00"))
    set_preferences("out", {"type:stalled_plan": False})
    send_and_route("out", "stalled_plan")
    send_and_route("blocked", "kickoff")
    vclock.advance(hours=3)
    send_and_route("blocked", "stalled_plan")
    for n in range(4):
        send_and_route("capped", "tip", {"n": n})
    vclock.set(datetime(2026, 12, 7, 22, 30, tzinfo=UTC))  # 23:30 in Berlin
    send_and_route("night", "kickoff")

    out = explain("out")
    assert "not sent: opted_out" in out
    assert _line(out, "opted_out").split()[3:6] == ["preferences", "suppress", "opted_out"]
    assert "recipient setting: type stalled_plan on every channel" in _line(out, "opted_out")

    night = explain("night")
    assert "deferred until 2026-12-08 06:00:00 UTC (in 7h 30m)" in night  # the clock: 22:30
    assert _line(night, "quiet_hours").split()[3:6] == ["quiet_hours", "defer", "quiet_hours"]
    assert "until 2026-12-08T07:00:00+01:00" in _line(night, "quiet_hours")

    blocked = explain("blocked")
    assert "stalled_plan" in blocked and "not sent: activation_window" in blocked
    assert (
        "another activation nudge (kickoff) holds the window until 2026-12-09T07:00:00+00:00"
        in blocked
    )
    # the kickoff is not sent: its route's send failed (no webhook url in this test)
    assert "kickoff" in blocked and "sent on" not in blocked

    capped = explain("capped")
    assert capped.count("not sent: fatigue_cap") == 1
    assert "user:capped reached 3 in 2026-12-07; folded into the 2026-12-07 summary" in capped
    assert "daily_summary  (summary:2026-12-07)" in capped
    assert "deferred until 2026-12-07 23:00:00 UTC" in capped  # local midnight


def _line(table: str, word: str) -> str:
    [line] = [ln for ln in table.splitlines() if ln.startswith("decided") and f" {word} " in ln]
    return line


def test_the_dry_run_table_shows_each_gate(gates, vclock):
    register_recipient("dee", timezone="Europe/Berlin")
    send_and_route("dee", "kickoff")
    table = plan_table(preview("dee", "stalled_plan", event_id="x"))
    assert table.splitlines()[0] == "dry run — outcome: suppress"
    assert [ln.split()[0] for ln in table.splitlines()[3:]] == [
        "preferences",
        "quiet_hours",
        "activation_window",
    ]


# --- 5. suppression, collapse, critical, locked, jurisdiction, org caps ----------------------------


def test_an_address_on_the_suppression_list_stops_that_channel(gates, vclock):
    register_recipient("eve", timezone="America/New_York", country="US")
    with engine().begin() as conn:
        gating.suppress_address(
            conn,
            "eve",
            channel="webhook",
            address="eve",
            reason="complained",
            detail="spam complaint",
            now=vclock.now,
        )
    promo = send_and_route("eve", "promo")
    assert [c for c, _, _ in deliveries_of("eve", promo)] == ["console"]
    assert decisions_of("eve", promo) == [
        (
            "suppression",
            "suppress",
            "suppressed_address",
            "webhook",
            "webhook address is on the suppression list (complained)",
        )
    ]
    receipt = send_and_route("eve", "receipt", {"order": "o-1"})  # locked types too
    assert deliveries_of("eve", receipt) == []
    assert _reasons("eve", receipt) == ["suppressed_address", "no_channel"]


def test_alerts_with_one_collapse_key_inside_the_window_make_one_delivery(gates, vclock, receiver):
    register_recipient("fay", timezone="Europe/Berlin")
    leader = send_and_route("fay", "cpu_alert", {"host": "a", "cluster": "prod"})
    vclock.advance(seconds=30)
    second = send_and_route("fay", "cpu_alert", {"host": "b", "cluster": "prod"})
    other = send_and_route("fay", "cpu_alert", {"host": "c", "cluster": "staging"})
    vclock.advance(seconds=89)
    third = send_and_route("fay", "cpu_alert", {"host": "d", "cluster": "prod"})
    assert [c for c, _, _ in deliveries_of("fay", leader)] == ["webhook"]
    assert [c for c, _, _ in deliveries_of("fay", other)] == ["webhook"]
    for follower in (second, third):
        assert deliveries_of("fay", follower) == []
        [(gate, outcome, reason, channel, detail)] = decisions_of("fay", follower)
        assert (gate, outcome, reason, channel) == ("collapse", "collapse", "collapsed", None)
        assert detail.startswith(f"collapsed into request {leader} (key 'cpu:prod', ")
        assert "window until 2026-12-07T07:02:00+00:00" in detail
    assert one("SELECT count(*) FROM deliveries") == 2
    assert rows("SELECT state FROM deliveries") == [("sent",), ("sent",)]
    assert receiver.arrivals.total == 2  # the leader and staging, sent by their routes
    assert (
        one("SELECT count FROM fatigue_counters") == 2
    )  # followers spend no cap: leader + staging
    vclock.advance(seconds=2)  # the window (120 s from the leader) has closed: a new group
    fourth = send_and_route("fay", "cpu_alert", {"host": "e", "cluster": "prod"})
    assert [c for c, _, _ in deliveries_of("fay", fourth)] == ["webhook"]
    assert decisions_of("fay", fourth) == []


def _three_followers(vclock: VirtualClock, batch: bool) -> list[int]:
    """A cpu_alert leader and three followers on the same cluster, 20 s apart or in one route batch."""
    items: list[dict[str, Any]] = [
        dict(
            user_id="fay",
            type_key="cpu_alert",
            event_id=f"a{n}",
            variables={"host": f"h{n}", "cluster": "prod"},
        )
        for n in range(4)
    ]
    if batch:
        made = notify_many(items)
        route(["fay"] * 4, [e.request_id for e in made])
        return [e.request_id for e in made]
    one_by_one: list[int] = []
    for item in items:
        one_by_one.append(send_and_route("fay", "cpu_alert", item["variables"], item["event_id"]))
        vclock.advance(seconds=20)
    return one_by_one


@pytest.mark.parametrize("batch", [False, True], ids=["one_by_one", "one_batch"])
def test_each_collapsed_follower_increments_the_groups_counter(gates, vclock, batch):
    register_recipient("fay", timezone="Europe/Berlin")
    leader, *followers = _three_followers(vclock, batch)
    details = [decisions_of("fay", f)[0][4] for f in followers]
    assert [d.split(", ")[1] for d in details] == ["2 so far", "3 so far", "4 so far"]
    assert rows("SELECT leader_id, count FROM collapse_groups") == [(leader, 4)]


def test_alerts_collapse_inside_one_route_batch(gates, vclock, receiver):
    register_recipient("gus", timezone="UTC")
    made = notify_many(
        [
            dict(
                user_id="gus",
                type_key="cpu_alert",
                event_id=f"a{n}",
                variables={"host": f"h{n}", "cluster": "prod"},
            )
            for n in range(3)
        ]
    )
    route(["gus"] * 3, [e.request_id for e in made])
    assert one("SELECT count(*) FROM deliveries") == 1
    assert rows("SELECT reason, count(*) FROM decisions GROUP BY 1") == [("collapsed", 2)]
    [(leader, state)] = rows("SELECT request_id, state FROM deliveries")
    assert (state, receiver.arrivals.total) == ("sent", 1)
    details = [d for (d,) in rows("SELECT detail FROM decisions")]
    assert all(d.startswith(f"collapsed into request {leader} (key 'cpu:prod'") for d in details)


def test_a_critical_alert_goes_out_in_quiet_hours_and_over_the_cap(gates, vclock, receiver):
    register_recipient("hal", timezone="Asia/Tokyo", quiet_hours=("22:00", "07:00"))
    vclock.set(datetime(2026, 12, 7, 18, 0, tzinfo=UTC))  # 03:00 in Tokyo
    tip = send_and_route("hal", "tip", {"n": 1})
    assert _reasons("hal", tip) == ["quiet_hours"]
    with engine().begin() as conn:  # and the day's cap is already spent
        for _ in range(3):
            fatigue_counters.claim_cap(
                conn,
                scope="user:hal",
                bucket="2026-12-08",
                limit=3,
                expires_at=datetime(2026, 12, 8, 15, 0, tzinfo=UTC),
            )
    outage = send_and_route("hal", "outage")
    assert [(c, s) for c, _, s in deliveries_of("hal", outage)] == [("webhook", "sent")]
    assert decisions_of("hal", outage) == []
    assert [o.split("/")[:2] for o in receiver.arrivals.occurrences] == [["hal", "outage"]]


def test_a_security_code_goes_to_a_recipient_who_unsubscribed_from_all(gates, vclock, receiver):
    register_recipient("ida", timezone="Europe/Berlin", quiet_hours=("00:00", "23:59"))
    set_preferences("ida", {"all": False})
    code = send_and_route("ida", "security_code", {"code": "424242"})
    assert [(c, s) for c, _, s in deliveries_of("ida", code)] == [("webhook", "sent")]
    assert decisions_of("ida", code) == []
    assert [o.split("/")[:2] for o in receiver.arrivals.occurrences] == [["ida", "security_code"]]
    kickoff = send_and_route("ida", "kickoff")
    assert _reasons("ida", kickoff) == ["opted_out", "no_channel"]


def test_marketing_is_opt_in_in_germany_and_opt_out_in_the_us(gates, vclock, receiver):
    register_recipient("jan", timezone="America/New_York", country="DE")  # country beats zone
    register_recipient("kim", timezone="Europe/Berlin", country="US")
    register_recipient("lee", timezone="America/Chicago")  # no country: the zone's
    de = send_and_route("jan", "promo")
    assert deliveries_of("jan", de) == []
    assert decisions_of("jan", de)[:2] == [
        (
            "preferences",
            "suppress",
            "opted_out",
            "webhook",
            "category default (marketing is opt-in in DE)",
        ),
        (
            "preferences",
            "suppress",
            "opted_out",
            "console",
            "category default (marketing is opt-in in DE)",
        ),
    ]
    for user in ("kim", "lee"):
        us = send_and_route(user, "promo")
        assert [(c, s) for c, _, s in deliveries_of(user, us)] == [
            ("console", "sent"),
            ("webhook", "sent"),
        ]
        assert decisions_of(user, us) == []
    assert sorted(o.split("/")[0] for o in receiver.arrivals.occurrences) == ["kim", "lee"]


def test_the_fatigue_cap_folds_the_overflow_into_one_summary(gates, vclock):
    register_recipient("max", timezone="Pacific/Auckland")
    vclock.set(datetime(2026, 12, 7, 20, 0, tzinfo=UTC))  # 09:00 on the 8th in Auckland
    made = [send_and_route("max", "tip", {"n": n}) for n in range(8)]
    assert [bool(deliveries_of("max", r)) for r in made] == [True] * 3 + [False] * 5
    assert all(_reasons("max", r) == ["fatigue_cap"] for r in made[3:])
    [summary] = summaries("max")
    assert summary["occurrence_key"] == "summary:2026-12-08"
    assert summary["state"] == "deferred"
    assert summary["due_at"] == datetime(2026, 12, 8, 11, 0, tzinfo=UTC)  # midnight in Auckland
    assert summary["variables"] == {"count": 5, "types": ["tip"]}


def test_an_overflow_folded_after_its_summary_was_taken_is_not_lost(gates, vclock):
    register_recipient("rae", timezone="Europe/Berlin")
    vclock.set(datetime(2026, 12, 7, 22, 59, 59, 900000, tzinfo=UTC))  # 23:59:59.9 local
    for n in range(4):
        send_and_route("rae", "tip", {"n": n})
    late = notify("rae", "tip", event_id="late", variables={"n": 4}).request_id
    # A route task for `late` reads its clock at 23:59:59.95 ...
    started = vclock.advance(seconds=0.05)
    # ... while at midnight the tick takes the day's summary and another worker routes it
    vclock.set(datetime(2026, 12, 7, 23, 0, 0, 100000, tzinfo=UTC))
    tick()
    [(summary,)] = rows(
        "SELECT id FROM requests WHERE type_key = 'daily_summary' AND state = 'pending'"
    )
    assert route(["rae"], [summary]) == 1
    vclock.set(started)  # the late task's `now`
    assert route(["rae"], [late]) == 1
    assert _reasons("rae", late) == ["fatigue_cap"]
    assert "folded into the 2026-12-07 summary" in decisions_of("rae", late)[0][4]
    assert sum(s["variables"]["count"] for s in summaries("rae")) == 2, (
        "the late overflow is in no summary"
    )


def test_the_organisation_cap_binds_across_its_members(gates, vclock):
    members = [f"m{n}" for n in range(20)]
    for user in members:
        register_recipient(user, timezone="UTC", org_id="acme")
    items = [
        dict(user_id=u, type_key="tip", event_id=f"{u}-{n}", variables={"n": n})
        for n in range(3)
        for u in members
    ]
    made = notify_many(items)
    route([i["user_id"] for i in items], [e.request_id for e in made])
    assert one("SELECT count(*) FROM deliveries") == 50
    assert rows("SELECT scope, count FROM fatigue_counters WHERE scope LIKE 'org:%'") == [
        ("org:acme", 50)
    ]
    folded = rows("SELECT detail FROM decisions WHERE reason = 'fatigue_cap'")
    assert len(folded) == 10 and all(
        d.startswith("org:acme reached 50 in 2026-12-07T07") for (d,) in folded
    )
    # a member's cap is not spent by a request the organisation cap folded
    assert one("SELECT sum(count) FROM fatigue_counters WHERE scope LIKE 'user:%'") == 50
    assert (
        one("SELECT sum((variables->>'count')::int) FROM requests WHERE type_key = 'daily_summary'")
        == 10
    )


# --- 6. the preferences API -----------------------------------------------------------------------


def test_get_preferences_returns_the_resolved_matrix_with_its_rules(gates):
    register_recipient("nia", timezone="Europe/Berlin")
    set_preferences(
        "nia",
        {
            "all": False,
            "category:marketing/webhook": True,
            "type:stalled_plan": True,
            "type:promo/console": True,
            "category:activation": False,
        },
    )
    got = get_preferences("nia")
    assert got["jurisdiction"] == "DE"
    assert got["settings"] == {
        "all": False,
        "category:marketing/webhook": True,
        "type:stalled_plan": True,
        "type:promo/console": True,
        "category:activation": False,
    }
    t = got["types"]
    assert t["receipt"]["webhook"] == {"enabled": True, "source": "locked (transactional)"}
    assert t["security_code"]["webhook"] == {"enabled": True, "source": "locked (security)"}
    assert t["stalled_plan"]["webhook"] == {  # per-type beats per-category
        "enabled": True,
        "source": "recipient setting: type stalled_plan on every channel",
    }
    assert t["kickoff"]["webhook"] == {  # per-category beats all
        "enabled": False,
        "source": "recipient setting: category activation on every channel",
    }
    assert t["promo"] == {
        "webhook": {"enabled": True, "source": "recipient setting: category marketing on webhook"},
        "console": {"enabled": True, "source": "recipient setting: type promo on console"},
    }
    assert t["tip"]["webhook"] == {
        "enabled": False,
        "source": "recipient setting: all notifications on every channel",
    }

    register_recipient("oz", timezone="America/Denver")  # nothing set: the defaults
    plain = get_preferences("oz")
    assert (plain["jurisdiction"], plain["settings"]) == ("US", {})
    assert plain["types"]["promo"]["console"] == {
        "enabled": True,
        "source": "category default (marketing is opt-out in US)",
    }
    assert plain["types"]["tip"]["webhook"] == {"enabled": True, "source": "category default"}


def test_clearing_a_setting_with_none_falls_back_to_the_next_rule(gates):
    register_recipient("pia", timezone="Europe/Paris")
    set_preferences("pia", {"type:promo": True})
    assert get_preferences("pia")["types"]["promo"]["webhook"]["enabled"] is True
    set_preferences("pia", {"type:promo": None})
    assert get_preferences("pia")["types"]["promo"]["webhook"] == {
        "enabled": False,
        "source": "category default (marketing is opt-in in FR)",
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"type:no_such_type": False},
        {"category:no_such_category": True},
        {"type:kickoff/carrier_pigeon": False},
        {"all/sms": False},  # a channel no type in this catalog uses
        {"category:security": False},
        {"category:transactional/webhook": False},
        {"type:security_code": False},
        {"type:receipt/webhook": False},
        {"type:kickoff": "no"},
        {"everything": False},
    ],
)
def test_set_preferences_rejects_bad_settings_and_writes_nothing(gates, bad):
    register_recipient("quinn", timezone="Europe/Berlin")
    set_preferences("quinn", {"type:tip": False})
    before = get_preferences("quinn")
    with pytest.raises(InvalidRequest, match=rf"(^|'){re.escape(next(iter(bad)))}('|: )"):
        set_preferences("quinn", {"all": False, "type:promo": True, **bad})  # valid ones first
    assert get_preferences("quinn") == before
    assert rows("SELECT scope, key, channel, enabled FROM preferences") == [
        ("type", "tip", "*", False)
    ]


def test_set_and_get_preferences_of_an_unknown_recipient_fail(gates):
    with pytest.raises(UnknownRecipient, match="unknown recipient 'ghost'"):
        set_preferences("ghost", {"all": False})
    with pytest.raises(UnknownRecipient, match="unknown recipient 'ghost'"):
        get_preferences("ghost")
    assert rows("SELECT count(*) FROM preferences") == [(0,)]
