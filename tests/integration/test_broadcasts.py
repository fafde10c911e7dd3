"""Broadcasts against real PostgreSQL and Redis, run by an in-process worker loop (the fan-out,
route and deliver tasks the code published, taken off the broker), counted at the receiver.

- topics: bulk subscribe and unsubscribe; bad input names the field and writes nothing;
- a topic broadcast and a segment broadcast reach each member once; opted-out ones have a reason;
- the idempotency key; a crash before and after a chunk's commit resumes without repeats or gaps;
- a step of several chunks at once: each member once; members who joined a stretch after the plan;
  two fan-outs of one broadcast at once (a lease run out): each member once, no deadlock;
- cancel mid-fan-out: what it reports equals what the receiver got; it waits for a chunk in flight;
- a local-time broadcast: each of 24 zones at its 09:00, one tick early nothing, on the tick all;
- the dry run counts by channel and reason with the route's own planner;
- explain answers for one recipient of a broadcast; the CLI and /metrics show progress.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text

from clarion import settings
from clarion.db import broadcasts as db
from clarion.db.engine import engine
from clarion.errors import (
    FaultInjected,
    InvalidField,
    MissingVariables,
    UnknownBroadcast,
    UnknownRecipient,
    UnknownTopic,
    UnknownType,
)
from clarion.ops.cli import main
from clarion.ops.explain import explain
from clarion.standins.receiver import Receiver
from clarion.tasks import register_recipient
from clarion.tasks.audiences import MAX_IDS, subscribe, unsubscribe
from clarion.tasks.broadcasts import (
    broadcast,
    broadcast_progress,
    cancel_broadcast,
    dry_run_broadcast,
    fan_out,
)
from clarion.tasks.recipients import forget
from clarion.tasks.tick import tick
from tests.support.broadcasts import join, recipients, use_broadcast_catalog, work
from tests.support.pipeline import (
    configure,
    count,
    counted,
    counts,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
    webhook_receiver,
)
from tests.support.race import waiting_on

pytestmark = pytest.mark.integration


@pytest.fixture
def env(clarion_env, monkeypatch) -> Iterator[None]:
    use_broadcast_catalog(monkeypatch)
    with publishing_to_this_tests_broker():
        yield


@pytest.fixture
def receiver(env, monkeypatch) -> Iterator[Receiver]:
    with webhook_receiver(monkeypatch) as running:
        yield running


def _received(receiver: Receiver, broadcast_id: int) -> dict[str, int]:
    """Arrivals at the receiver per user for this broadcast's occurrence."""
    got: dict[str, int] = {}
    with receiver.arrivals.lock:
        for occurrence, keys in receiver.arrivals.occurrences.items():
            user, _, occ = occurrence.split("/", 2)
            if occ == f"broadcast:{broadcast_id}":
                got[user] = sum(receiver.arrivals.by_key[k] for k in keys)
    return got


# --- topics ------------------------------------------------------------------------------------


def test_subscribe_and_unsubscribe_in_bulk_count_what_changed(env):
    users = recipients("t", 30)
    assert subscribe("beta", users[:20]) == 20
    assert subscribe("beta", users[10:30]) == 10  # ten were members already
    assert unsubscribe("beta", users[:5] + ["nobody"]) == 5
    assert count("topic_members", "topic_key = 'beta'") == 25


def test_a_subscribe_naming_an_unknown_recipient_adds_nobody(env):
    users = recipients("t", 3)
    with pytest.raises(UnknownRecipient, match="'ghost'"):
        subscribe("beta", [*users, "ghost"])
    assert count("topic_members") == 0 and count("topics") == 0


@pytest.mark.parametrize(
    ("topic", "ids", "field"),
    [
        ("beta", [f"u{n}" for n in range(MAX_IDS + 1)], "user_ids"),
        ("beta", [], "user_ids"),
        ("beta", "u1", "user_ids"),
        ("beta", ["u1", 7], r"user_ids\[1\]"),
        ("no spaces", ["u1"], "topic"),
        ("", ["u1"], "topic"),
    ],
)
def test_bad_subscribe_calls_name_the_field(env, topic, ids, field):
    with pytest.raises(InvalidField, match=f"^{field}: "):
        subscribe(topic, ids)


# --- broadcasts to a topic and a segment ---------------------------------------------------------


def test_a_topic_broadcast_reaches_each_member_once_and_records_why_not_for_the_rest(receiver):
    us = recipients("us", 40)
    de = recipients("de", 6, country="DE", zone="Europe/Berlin", locale="de")
    recipients("other", 10)  # not members
    join("news", us + de)
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "7"})
    assert started.new and started.planned == 46
    # fan-out in chunks of 7, as the tick would publish it after a lost first message
    assert fan_out(started.id, chunk=7) == 46
    work()

    got = _received(receiver, started.id)
    assert got == {u: 1 for u in us}  # every US member once; DE: marketing is opt-in there
    shown = broadcast_progress(started.id).as_json()
    assert shown["state"] == "done"
    assert (shown["planned"], shown["requested"], shown["sent"]) == (46, 46, 40)
    assert shown["suppressed"] == {"opted_out": 6}


def test_a_segment_broadcast_filters_on_recipient_fields(receiver):
    recipients("en", 12, country="US", locale="en")
    recipients("es", 5, country="US", locale="es")
    recipients("ca", 4, country="CA", locale="en")
    started = broadcast("notice", {"segment": {"country": ["US"], "locale": "en"}})
    work()
    assert set(_received(receiver, started.id)) == {f"en{n:06d}" for n in range(12)}


def test_a_segment_on_a_custom_attribute_reaches_those_who_have_it(receiver):
    for n, (plan, beta) in enumerate(
        [("pro", True), ("pro", False), ("free", True), ("team", True)]
    ):
        register_recipient(f"a{n}", timezone="UTC", attributes={"plan": plan, "beta": beta})
    register_recipient("a9", timezone="UTC", attributes={"plan": "pro", "seats": 3})  # no beta
    register_recipient("plain", timezone="UTC")  # no attributes at all
    segment = {"attributes.plan": ["pro", "team"], "attributes.beta": True}
    assert dry_run_broadcast("notice", {"segment": segment}).planned == 2
    started = broadcast("notice", {"segment": segment})
    work()
    assert _received(receiver, started.id) == {"a0": 1, "a3": 1}
    # an integer attribute matches its text; re-registering without attributes keeps them
    register_recipient("a9", timezone="UTC", locale="de")
    seats = broadcast("notice", {"segment": {"attributes.seats": 3}})
    work()
    assert _received(receiver, seats.id) == {"a9": 1}


@pytest.mark.parametrize(
    ("segment", "match"),
    [
        ({"attributes.tier": "gold"}, "^audience.segment.attributes.tier: is not an attribute"),
        ({"attributes.plan": "pro", "attributes.tyer": "x"}, "^audience.segment.attributes.tyer: "),
        ({"attributes.1x": "pro"}, "^audience.segment.attributes.1x: must be a letter"),
        ({"attributes.plan": 1.5}, r"^audience.segment.attributes.plan: must be a value"),
        (
            {"attributes.plan": [{"a": 1}]},
            r"^audience.segment.attributes.plan\[0\]: must be a text",
        ),
        ({"plan": "pro"}, "^audience.segment.plan: is not a segment field.*attributes.<name>"),
    ],
)
def test_a_segment_on_an_unknown_or_bad_attribute_is_refused_naming_it(env, segment, match):
    register_recipient("a0", timezone="UTC", attributes={"plan": "pro"})
    before = counts()
    for call in (broadcast, dry_run_broadcast):
        with pytest.raises(InvalidField, match=match):
            call("notice", {"segment": segment})
    assert counts() == before and count("broadcasts") == 0


def test_a_repeated_idempotency_key_returns_the_first_broadcast_and_writes_nothing(receiver):
    users = recipients("us", 9)
    join("news", users)
    first = broadcast("newsletter", {"topic": "news"}, {"issue": "1"}, idempotency_key="k-1")
    again = broadcast("newsletter", {"topic": "news"}, {"issue": "1"}, idempotency_key="k-1")
    work()
    assert (again.id, again.new, first.new) == (first.id, False, True)
    assert count("broadcasts") == 1 and count("requests") == 9
    assert _received(receiver, first.id) == {u: 1 for u in users}


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: broadcast("nope", {"topic": "news"}), UnknownType, "'nope'"),
        (lambda: broadcast("newsletter", {"topic": "news"}), MissingVariables, "issue"),
        (lambda: broadcast("notice", {"topic": "missing"}), UnknownTopic, "^audience.topic: "),
        (
            lambda: broadcast("notice", {"segment": {"colour": "red"}}),
            InvalidField,
            "^audience.segment.colour: is not a segment field",
        ),
        (lambda: broadcast("notice", {"everyone": True}), InvalidField, "^audience.everyone: "),
        (lambda: broadcast("notice", {}), InvalidField, "^audience: name a topic"),
        (lambda: broadcast("notice", {"topic": "news"}, at="25:00"), InvalidField, "^at: "),
        (
            lambda: broadcast("notice", {"topic": "news"}, at=datetime(2027, 1, 1)),
            InvalidField,
            "^at: ",
        ),
        (lambda: broadcast("notice", {"topic": "news"}, passed="never"), InvalidField, "^passed"),
    ],
)
def test_bad_broadcasts_name_the_field_and_write_nothing(env, call, error, match):
    join("news", recipients("us", 2))
    before = counts()
    with pytest.raises(error, match=match):
        call()
    assert counts() == before and count("broadcasts") == 0


# --- crash, resume, cancel -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("point", "fills", "written"),
    [
        ("broadcast.before_commit", 1, 0),  # the chunk's transaction dies: nothing of it
        ("broadcast.before_commit", 2, 8),  # one of the step's two dies, the other commits
        ("broadcast.after_chunk", 1, 8),  # the step's chunks committed, the cursor not moved
        ("broadcast.after_chunk", 3, 24),
    ],
)
def test_a_fan_out_that_dies_in_a_step_resumes_without_repeats_or_gaps(
    receiver, monkeypatch, point, fills, written
):
    users = recipients("us", 50)
    join("news", users)
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "2"})
    configure(
        monkeypatch, faults=f"{point}=raise*1", webhook_url=receiver.url, broadcast_fills=fills
    )
    with pytest.raises(FaultInjected, match=point):
        fan_out(started.id, chunk=8)
    assert count("requests") == written
    [wave] = rows("SELECT cursor, requested FROM broadcast_waves")
    # counted with the chunks that committed; the cursor moves only past a whole step, so the
    # next fan-out walks these chunks again (and finds them requested)
    assert wave == {"cursor": None, "requested": written}
    # the fan-out's message is gone with it; the tick publishes it again once its lease ends,
    # and the requests of the committed chunks once they are stray
    with frozen_clock(datetime.now(UTC) + timedelta(minutes=5)):
        assert tick()["broadcasts"] == 1
        work()
    assert _received(receiver, started.id) == {u: 1 for u in users}
    assert broadcast_progress(started.id).broadcast.requested == 50


@pytest.mark.parametrize("fills", [1, 2, 4])
def test_a_step_of_several_chunks_requests_each_member_once(receiver, monkeypatch, fills):
    # 3 chunks of 7 and a member over (a wave that is not a whole number of chunks), and a
    # segment that leaves out every fourth member (the chunks are counted after the filter)
    users = recipients("us", 22) + recipients("ca", 8, country="CA")
    join("news", users)
    configure(monkeypatch, webhook_url=receiver.url, broadcast_fills=fills)
    started = broadcast(
        "newsletter", {"topic": "news", "segment": {"country": "US"}}, {"issue": "4"}
    )
    assert fan_out(started.id, chunk=7) == 22
    work()
    assert _received(receiver, started.id) == {u: 1 for u in users[:22]}
    done = broadcast_progress(started.id).broadcast
    assert (done.state, done.requested) == ("done", 22)


def test_members_who_join_a_stretch_after_the_plan_are_covered_by_the_next_step(env):
    """The plan splits the wave by who is in the audience then; a chunk that finds its stretch
    grown past what it takes leaves the cursor at its last member, and the next step goes on
    from there (joined: requested; walked twice: requested once)."""
    join("news", recipients("a", 6) + recipients("c", 6))
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "5"})
    now = datetime.now(UTC)
    with engine().connect() as conn:
        step = db.plan_step(conn, started.id, now=now, chunk=3, fills=2)
    assert step is not None and step.starts == ["", "a000002"]  # a000000-2, then 3 from a000003
    joined = recipients("a0000015", 5)  # a0000015000000…: 5 new members inside the first stretch
    join("news", joined)
    filled = []
    for at in range(2):
        with engine().begin() as conn:
            filled.append(db.fill(conn, step, at, chunk=3, now=now, due_at=now))
    # the first took 6 (twice its chunk) of its 8 members and stopped there: a gap after it
    assert [len(f.keys) for f in filled] == [6, 3] and filled[0].last == joined[3]
    with engine().begin() as conn:
        assert db.advance(conn, step, filled, now=now, lease=30) is False
    assert rows("SELECT cursor FROM broadcast_waves") == [{"cursor": joined[3]}]
    assert fan_out(started.id, chunk=3) == 17 - 9
    assert (
        count("requests")
        == 17
        == len(set(r["user_id"] for r in rows("SELECT user_id FROM requests")))
    )
    assert broadcast_progress(started.id).broadcast.requested == 17


def test_a_cancel_waits_for_a_chunk_in_flight_and_a_chunk_after_it_writes_nothing(env):
    join("news", recipients("us", 20))
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "6"})
    now = datetime.now(UTC)
    with engine().connect() as conn:
        step = db.plan_step(conn, started.id, now=now, chunk=5, fills=3)
    assert step is not None and len(step.starts) == 3
    with engine().connect() as conn, conn.begin():
        assert db.fill(conn, step, 0, chunk=5, now=now, due_at=now) is not None
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with ThreadPoolExecutor(1) as pool:
            cancelling = pool.submit(cancel_broadcast, started.id)
            # the cancel waits on the chunk's row lock (seen in PostgreSQL, not assumed)
            assert waiting_on(pid, within=10) and not cancelling.done()
            # (leaving the pool waits for the cancel: commit first, from this thread)
            conn.commit()
            stopped = cancelling.result(timeout=30)
    assert (stopped.state, stopped.requested) == ("cancelled", 5)
    # a chunk of the same step after the cancel says so; its caller rolls it back (tasks)
    with engine().connect() as conn, conn.begin() as transaction:
        assert db.fill(conn, step, 1, chunk=5, now=now, due_at=now) is None
        transaction.rollback()
    assert count("requests") == 5 == broadcast_progress(started.id).broadcast.requested


def test_two_fan_outs_of_one_broadcast_at_once_request_each_member_once(receiver, monkeypatch):
    """A fan-out whose lease ran out is published again while the first still runs: both walk
    the same stretch; the second waits for the first's uncommitted chunk (seen in PostgreSQL)
    and finds its members requested. Nobody twice, the counters exact, no deadlock."""
    users = recipients("us", 40)
    join("news", users)
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "7"})
    # the first step's two chunks hold their transactions open for a while before the commit
    configure(
        monkeypatch,
        faults="broadcast.before_commit=sleep:1*2",
        webhook_url=receiver.url,
        broadcast_fills=2,
    )
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(fan_out, started.id, chunk=5)
        holder = _backend_in_transaction()
        second = pool.submit(fan_out, started.id, chunk=5)
        # two wait on the chunk holding its transaction open: the first fan-out's other chunk
        # (for the wave's row) and one of the second's (for the same recipients' requests)
        assert len(waiting_on(holder, within=10, at_least=2)) >= 2
        requested = first.result(timeout=60) + second.result(timeout=60)
    assert requested == 40
    work()
    assert _received(receiver, started.id) == {u: 1 for u in users}
    done = broadcast_progress(started.id).broadcast
    assert (done.state, done.requested) == ("done", 40)
    assert rows("SELECT requested FROM broadcast_waves") == [{"requested": 40}]


def _backend_in_transaction(seconds: float = 10) -> int:
    """The pid of a backend of this database idle in an open transaction, once there is one."""
    with engine().connect() as conn:
        for _ in range(int(seconds / 0.01)):
            pid = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'idle in transaction' AND pid <> pg_backend_pid() LIMIT 1"
                )
            ).scalar_one_or_none()
            if pid is not None:
                return int(pid)
            conn.rollback()
            time.sleep(0.01)
    raise AssertionError("no backend came to hold a transaction open")


def test_cancel_mid_fan_out_reports_what_the_receiver_then_gets(receiver):
    users = recipients("us", 60)
    join("news", users)
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "3"})
    # one step (two chunks at once, by default), then it hands over to a new message
    assert fan_out(started.id, chunk=10, seconds=0) == 20
    stopped = cancel_broadcast(started.id)
    work()  # the handed-over message finds the broadcast cancelled
    got = _received(receiver, started.id)
    assert stopped.state == "cancelled" and stopped.requested == 20
    assert sum(got.values()) == len(got) == stopped.requested
    assert cancel_broadcast(started.id).requested == 20  # again: the same answer
    with pytest.raises(UnknownBroadcast, match="no broadcast 999"):
        cancel_broadcast(999)


# --- local time ----------------------------------------------------------------------------------

# 2026-03-29: Europe moves its clocks forward at 01:00 UTC, before its 09:00.
DST_DAY = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
ZONES = (
    "Pacific/Kiritimati",
    "Pacific/Chatham",
    "Pacific/Auckland",
    "Australia/Adelaide",
    "Asia/Tokyo",
    "Asia/Shanghai",
    "Asia/Kathmandu",
    "Asia/Kolkata",
    "Asia/Tehran",
    "Asia/Dubai",
    "Europe/Moscow",
    "Africa/Nairobi",
    "Europe/Berlin",
    "Europe/London",
    "UTC",
    "Atlantic/Azores",
    "America/Sao_Paulo",
    "America/St_Johns",
    "America/New_York",
    "America/Chicago",
    "America/Denver",
    "America/Los_Angeles",
    "Pacific/Marquesas",
    "Pacific/Honolulu",
)


def _nine(zone: str, now: datetime) -> datetime:
    """The next 09:00 on the wall clocks of `zone` at or after `now`, by the standard library."""
    local = now.astimezone(ZoneInfo(zone))
    for days in (0, 1):
        at = datetime.combine(local.date() + timedelta(days=days), datetime.min.time()).replace(
            hour=9, tzinfo=ZoneInfo(zone)
        )
        if at.astimezone(UTC) >= now:
            return at.astimezone(UTC)
    raise AssertionError(zone)


def test_a_local_time_broadcast_reaches_each_zone_at_its_nine_oclock(receiver):
    tick_seconds = settings.get().tick_interval
    members = {zone: recipients(f"z{n:02d}-", 2, zone=zone) for n, zone in enumerate(ZONES)}
    join("world", [u for users in members.values() for u in users])
    with frozen_clock(DST_DAY) as clk:
        started = broadcast("newsletter", {"topic": "world"}, {"issue": "9"}, at="09:00")
        assert started.planned == 2 * len(ZONES)
        expected = {zone: _nine(zone, DST_DAY) for zone in ZONES}
        assert expected["Europe/Berlin"] == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)  # CEST
        for at in sorted(set(expected.values())):
            due = {u for zone, t in expected.items() if t == at for u in members[zone]}
            clk.now = at - timedelta(seconds=tick_seconds)
            tick()
            work()
            assert not due & set(_received(receiver, started.id)), f"early before {at}"
            clk.now = at
            tick()
            work()
            missing = due - set(_received(receiver, started.id))
            assert not missing, (at, _ledger_of(missing))
    assert _received(receiver, started.id) == {u: 1 for us in members.values() for u in us}
    assert broadcast_progress(started.id).broadcast.state == "done"


def _ledger_of(users: set[str]) -> list[dict]:
    return rows(
        "SELECT r.user_id, r.state, r.created_at, d.state AS delivery, d.last_error, d.due_at "
        "FROM requests r LEFT JOIN deliveries d ON d.user_id = r.user_id AND d.request_id = r.id "
        "WHERE r.user_id = ANY(:users)",
        users=sorted(users),
    )


def test_skip_leaves_out_the_zones_whose_nine_oclock_passed_today(env):
    recipients("tokyo", 3, zone="Asia/Tokyo")  # 21:00 there
    recipients("ny", 2, zone="America/New_York")  # 07:00 there
    with frozen_clock(datetime(2026, 6, 1, 12, 0, tzinfo=UTC)):
        started = broadcast("notice", {"segment": {"country": "US"}}, at="09:00", passed="skip")
    assert (started.planned, started.skipped) == (2, 3)
    assert started.first_at == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)


# --- dry run and explain -------------------------------------------------------------------------


def test_the_dry_run_counts_by_channel_and_reason_and_writes_nothing(env):
    join("news", recipients("us", 7) + recipients("de", 3, country="DE", zone="Europe/Berlin"))
    before = counts()
    plan = dry_run_broadcast("newsletter", {"topic": "news"}, {"issue": "4"}).as_json()
    assert plan == {
        "planned": 10,
        "skipped": 0,
        "deliver": 7,
        "by_channel": {"webhook": 7},
        "by_reason": {"opted_out": 3},
    }
    assert counts() == before and count("broadcasts") == 0


def test_explain_answers_for_one_recipient_of_a_broadcast(receiver):
    register_recipient("karl", timezone="Europe/Berlin", country="DE")
    join("news", ["karl"])
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "5"})
    work()
    said = explain("karl", type_key="newsletter")
    assert f"(broadcast:{started.id})" in said and "opted_out" in said


# --- the CLI and /metrics ------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit, match="^0$"):
        main(list(argv))
    return capsys.readouterr().out


def test_the_cli_dry_runs_starts_follows_and_cancels_a_broadcast(receiver, capsys):
    join("news", recipients("us", 4) + recipients("de", 2, country="DE", zone="Europe/Berlin"))
    args = ("newsletter", "--topic", "news", "--var", "issue=8")
    planned = _cli(capsys, "broadcast", *args, "--dry-run")
    assert "not sent: opted_out" in planned and count("broadcasts") == 0
    assert "broadcast 1 started: 6 planned" in _cli(capsys, "broadcast", *args, "--key", "k")
    assert "already existed" in _cli(capsys, "broadcast", *args, "--key", "k")
    work()
    shown = _cli(capsys, "broadcasts", "1")
    assert "suppressed: opted_out  2" in shown and "sent" in shown
    listed = _cli(capsys, "broadcasts")
    assert "suppressed" in listed.splitlines()[1]  # the header
    row = next(line for line in listed.splitlines() if "newsletter  done" in line).split()
    # id type state at planned skipped requested sent waiting suppressed created
    assert row[:10] == ["1", "newsletter", "done", "now", "6", "0", "6", "4", "0", "opted_out=2"]
    assert "broadcast 1 done; 6 recipient(s) requested" in _cli(
        capsys, "broadcasts", "1", "--cancel"
    )


def test_metrics_show_a_broadcasts_plan_progress_and_suppressions_by_reason(receiver):
    join("news", recipients("us", 20) + recipients("de", 5, country="DE", zone="Europe/Berlin"))
    started = broadcast("newsletter", {"topic": "news"}, {"issue": "9"})
    assert fan_out(started.id, chunk=5, seconds=0) == 10  # one step of two chunks
    running = {"broadcast": str(started.id), "type": "newsletter", "state": "running"}
    assert counted("clarion_broadcast_planned", **running) == 25
    assert counted("clarion_broadcast_requested", **running) == 10
    assert counted("clarion_broadcast_sent", **running) == 0
    assert counted("clarion_broadcast_waiting", **running) == 10
    work()
    done = {**running, "state": "done"}
    assert counted("clarion_broadcast_requested", **done) == 25
    assert counted("clarion_broadcast_sent", **done) == 20 == receiver.arrivals.unique
    assert counted("clarion_broadcast_waiting", **done) == 0
    reason = {"broadcast": str(started.id), "reason": "opted_out"}
    assert counted("clarion_broadcast_suppressed", **reason) == 5
    assert counted("clarion_broadcast_requested", **running) == 0  # one series per broadcast


def test_an_erased_recipient_leaves_every_topic(env):
    users = recipients("us", 3)
    join("news", users)
    join("beta", users[:1])
    forget(users[0])
    assert count("topic_members", "user_id = :u", u=users[0]) == 0
    assert count("topic_members") == 2
