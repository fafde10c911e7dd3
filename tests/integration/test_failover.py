"""Provider failover end to end (adapters/failover.py, adapters/circuit.py): email through SendGrid
then SMTP, SMS through two Twilio accounts, each a local stand-in driven by its real SDK (or
smtplib), real PostgreSQL and Redis (the circuits and the budgets), the pipeline in-process.

The outage run: the primaries refuse connections, then answer 5xx, then recover, while messages
keep coming. Counted at the stand-ins, per message: none lost, an at-least-once message taken
twice only where its delivery has a `possible_duplicate` incident, each provider's busiest second
within its own budget; the time to fail over and back is printed. The default tier sends about
100 messages; the soak tier 2,000. Smaller tests: an at-most-once send whose answer is a 5xx is
never failed over; the second account's signed callbacks are accepted and matched; the circuit
in Redis is one for every process and judged on Redis's clock.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import text

from clarion.adapters.circuit import Circuits, Policy, RedisBackend, State
from clarion.db.engine import engine
from clarion.standins.fake_sendgrid import EventKey, FakeSendGrid, event, post_events
from clarion.standins.fake_slack import serving
from clarion.standins.fake_smtp import FakeSmtp
from clarion.standins.fake_twilio import FakeTwilio
from clarion.tasks import notify, register_recipient, runtime
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.web.app import create_app
from tests.support.mail import email_settings
from tests.support.pipeline import (
    configure,
    counted,
    drain,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

CATALOG = Path(__file__).parents[1] / "catalog_failover.yaml"
BACKUP_SID, BACKUP_TOKEN, BACKUP_NUMBER = "AC" + "b" * 32, "backup-token", "+15005550007"
OPEN_FOR = 1.0  # seconds an open circuit waits for its probe (CLARION_CIRCUIT_OPEN_SECONDS)
PER_SECOND = 10  # each provider's budget: clarion spends 90% of it
USERS = 10


@dataclass
class World:
    sendgrid: FakeSendGrid
    smtp: FakeSmtp
    twilio: FakeTwilio
    backup: FakeTwilio
    web: str
    per_second: int  # each provider's budget (clarion spends 90% of it)


@pytest.fixture
def world(clarion_env, monkeypatch, request) -> Iterator[World]:
    per_second = getattr(request, "param", PER_SECOND)
    with (
        FakeSendGrid() as sendgrid,
        FakeSmtp() as smtp,
        FakeTwilio() as twilio,
        FakeTwilio(account_sid=BACKUP_SID, auth_token=BACKUP_TOKEN) as backup,
        serving(create_app()) as web,
    ):
        configure(
            monkeypatch,
            **email_settings(
                catalog=CATALOG,
                public_url=web,
                email_providers="sendgrid,smtp",
                sendgrid_api_key=FakeSendGrid.API_KEY,
                sendgrid_api_url=sendgrid.url,
                smtp_url=smtp.url,
                email_per_second=per_second,
                twilio_account_sid=FakeTwilio.ACCOUNT_SID,
                twilio_auth_token=FakeTwilio.AUTH_TOKEN,
                twilio_api_url=twilio.url,
                twilio_from=FakeTwilio.NUMBER,
                twilio_backup_account_sid=BACKUP_SID,
                twilio_backup_auth_token=BACKUP_TOKEN,
                twilio_backup_api_url=backup.url,
                twilio_backup_from=BACKUP_NUMBER,
                sms_segments_per_second=per_second,
                twilio_timeout=1,
                circuit_failures=3,
                circuit_open_seconds=OPEN_FOR,
                circuit_probe_seconds=2,
            ),
        )
        for n in range(USERS):
            register_recipient(
                f"u{n}",
                timezone="UTC",
                addresses={"email": f"u{n}@example.com", "sms": f"+49151000000{n:02d}"},
            )
        with publishing_to_this_tests_broker():
            yield World(sendgrid, smtp, twilio, backup, web, per_second)


# --- driving and counting -----------------------------------------------------------------------


def send(n: int, type_key: str, **variables: str) -> None:
    """Notify and route message `n` (to user u{n % USERS}); the route makes the first attempt."""
    user = f"u{n % USERS}"
    request = notify(user, type_key, event_id=f"m{n}", variables=variables)
    route([user], [request.request_id])
    drain("transactional"), drain("activation")


def send_paced(numbers: range, seconds: float, batch: int) -> None:
    """At-least-once email and SMS alternately, routed `batch` at a time (each route sends its
    batch concurrently) and spread over at least `seconds`: the phase must outlast an open
    circuit's wait, so that a probe meets the phase's fault."""
    start, chunks = time.monotonic(), range(numbers.start, numbers.stop, batch)
    for i, first in enumerate(chunks):
        requested = []
        for n in range(first, min(first + batch, numbers.stop)):
            user = f"u{n % USERS}"
            type_key, order = ("sms_receipt", f"S-{n}") if n % 2 else ("receipt_email", f"E-{n}")
            made = notify(user, type_key, event_id=f"m{n}", variables={"order": order})
            requested.append((user, made.request_id))
        route([u for u, _ in requested], [r for _, r in requested])
        drain("transactional"), drain("activation")
        pause = start + seconds * (i + 1) / len(chunks) - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the arrivals, not waiting for an outcome


def settle(limit: float = 120.0) -> None:
    """Run every delivery still owed to its end: retries and deferrals due now (their waits are
    tested elsewhere), the budgets refilling on Redis's clock."""
    end = time.monotonic() + limit
    while True:
        owed = rows("SELECT user_id, id FROM deliveries WHERE state IN ('pending', 'claimed')")
        if not owed:
            return
        assert time.monotonic() < end, f"{len(owed)} deliveries still owed after {limit:.0f} s"
        with engine().begin() as conn:
            conn.execute(text("UPDATE deliveries SET not_before = now() WHERE state = 'pending'"))
        deliver([r["user_id"] for r in owed], [r["id"] for r in owed])
        time.sleep(0.1)  # a full budget frees on Redis's clock; nothing else waits on this


def email_subjects(world: World) -> list[tuple[str, float]]:
    return [(s.payload["subject"], s.arrived) for s in world.sendgrid.sent] + [
        (str(m.message["Subject"]), m.arrived) for m in world.smtp.messages
    ]


def sms_bodies(world: World) -> list[tuple[str, float]]:
    return [(m.body, m.arrived) for m in world.twilio.accepted + world.backup.accepted]


def busiest_second(arrivals: list[float]) -> int:
    """The most arrivals in any one-second window."""
    times, start, most = sorted(arrivals), 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most


def first_after(arrivals: list[float], since: float) -> float | None:
    later = [a for a in arrivals if a >= since]
    return min(later) - since if later else None


@dataclass
class Report:
    messages: int
    at_standins: Counter[str] = field(default_factory=Counter)
    fail_over: dict[str, float | None] = field(default_factory=dict)
    fail_back: dict[str, float | None] = field(default_factory=dict)


def outage_run(world: World, total: int, phase: float, batch: int) -> Report:
    """Healthy, refusing connections, answering 5xx, recovered: a quarter of `total` in each."""
    quarter = total // 4
    send_paced(range(0, quarter), phase, batch)
    down = time.monotonic()
    world.sendgrid.refuse()
    world.twilio.refuse()
    send_paced(range(quarter, 2 * quarter), phase, batch)
    world.sendgrid.reopen()
    world.twilio.reopen()
    world.sendgrid.fail(500, times=100_000)
    world.twilio.fail(500, times=100_000)
    send_paced(range(2 * quarter, 3 * quarter), phase, batch)
    up = time.monotonic()
    with world.sendgrid.lock:
        world.sendgrid.failures.clear()
    world.twilio.recover()
    send_paced(range(3 * quarter, 4 * quarter), phase, batch)
    settle(limit=60 + 2 * total / (0.9 * world.per_second))
    report = Report(4 * quarter)
    report.at_standins.update(s for s, _ in email_subjects(world))
    report.at_standins.update(b for b, _ in sms_bodies(world))
    smtp_at = [m.arrived for m in world.smtp.messages]
    backup_at = [m.arrived for m in world.backup.accepted]
    report.fail_over = {"email": first_after(smtp_at, down), "sms": first_after(backup_at, down)}
    report.fail_back = {
        "email": first_after([s.arrived for s in world.sendgrid.sent], up),
        "sms": first_after([m.arrived for m in world.twilio.accepted], up),
    }
    return report


def check(world: World, report: Report) -> None:
    sent = rows("SELECT user_id, id, state, platform FROM deliveries ORDER BY id")
    assert len(sent) == report.messages
    assert Counter(r["state"] for r in sent) == {"sent": report.messages}  # 0 lost, none held
    expected = {f"Receipt E-{n}" for n in range(0, report.messages, 2)} | {
        f"Order S-{n} shipped." for n in range(1, report.messages, 2)
    }
    assert set(report.at_standins) == expected  # every message reached a stand-in
    repeated = {m for m, times in report.at_standins.items() if times > 1}
    incidents = rows("SELECT kind FROM incidents")
    # an at-least-once message taken twice is a possible_duplicate incident (and only that kind)
    assert len(repeated) <= sum(r["kind"] == "possible_duplicate" for r in incidents)
    assert {r["kind"] for r in incidents} <= {"possible_duplicate"}
    platforms = Counter(r["platform"] for r in sent)
    assert set(platforms) == {"sendgrid", "smtp", "twilio", "twilio_backup"}, platforms
    # each provider's own budget held at its stand-in (clarion spends 90% of it)
    budget = int(world.per_second * 0.9)
    for arrivals in (
        [s.arrived for s in world.sendgrid.sent],
        [m.arrived for m in world.smtp.messages],
        [m.arrived for m in world.twilio.accepted],
        [m.arrived for m in world.backup.accepted],
    ):
        assert 0 < busiest_second(arrivals) <= budget
    # the 5xx phase met a probe at each primary (an open circuit let one through), and no
    # message taken by a secondary was refused by its primary with a 5xx first
    assert any(c.status == 500 for c in world.sendgrid.calls)
    assert any(a.status == 500 for a in world.twilio.attempts)


def show(report: Report, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(
            f"\nfailover of {report.messages} messages: to the secondary after "
            f"{_s(report.fail_over)}; back to the primary after {_s(report.fail_back)}"
        )


def _s(times: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {v:.2f} s" if v is not None else f"{k} never" for k, v in times.items())


# --- the outage run -----------------------------------------------------------------------------


def test_an_outage_fails_over_and_back_losing_nothing(world, capsys):
    before = counted("clarion_provider_failovers_total", channel="email")
    report = outage_run(world, 100, phase=2.5 * OPEN_FOR, batch=4)
    check(world, report)
    assert report.fail_over["email"] is not None and report.fail_back["email"] is not None
    assert report.fail_over["sms"] is not None and report.fail_back["sms"] is not None
    assert counted("clarion_provider_failovers_total", channel="email") > before
    alerts = rows("SELECT subject, cleared_at FROM alerts WHERE kind = 'provider_failover'")
    assert {a["subject"] for a in alerts} == {"email:sendgrid", "sms:twilio"}
    assert all(a["cleared_at"] is not None for a in alerts)  # cleared once each took mail again
    circuits = runtime.collaborators().circuits
    assert circuits.read("email:sendgrid").after.state is State.CLOSED
    assert circuits.read("sms:twilio").after.state is State.CLOSED
    show(report, capsys)


@pytest.mark.soak
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("world", [40], indirect=True)
def test_an_outage_of_2000_emails_and_sms_fails_over_and_back_losing_nothing(world, capsys):
    report = outage_run(world, 2000, phase=15 * OPEN_FOR, batch=20)
    check(world, report)
    show(report, capsys)


# --- what failover must not do, and what it must accept -------------------------------------------


@pytest.mark.parametrize(
    ("type_key", "standin", "state"),
    [
        ("digest_email", "sendgrid", "unknown"),  # held: SendGrid can neither dedup nor be asked
        ("sms_nudge", "twilio", "pending"),  # owed a look-up at Twilio before anything else
    ],
)
def test_an_at_most_once_send_answered_5xx_never_fails_over(world, type_key, standin, state):
    primary = getattr(world, standin)
    primary.fail(500, times=5)
    send(1, type_key, name="Ana")
    [row] = rows("SELECT state, maybe_sent_at, platform FROM deliveries")
    assert (row["state"], row["platform"]) == (state, None)
    assert row["maybe_sent_at"] is not None or state == "unknown"
    assert world.smtp.messages == [] and world.backup.accepted == []  # nothing to the secondary
    assert len(primary.calls if standin == "sendgrid" else primary.attempts) == 1


def test_the_second_accounts_signed_callbacks_are_accepted_and_matched(world):
    world.twilio.refuse()
    send(1, "sms_receipt", order="S-1")
    [message] = world.backup.accepted
    [row] = rows("SELECT user_id, id, state, platform, provider_message_id FROM deliveries")
    assert (row["state"], row["platform"], row["provider_message_id"]) == (
        "sent",
        "twilio_backup",
        message.sid,
    )
    assert [code for _, code in world.backup.progress(message.sid)] == [204, 204, 204]
    [row] = rows("SELECT state FROM deliveries")
    assert row["state"] == "delivered"
    assert {r["platform"] for r in rows("SELECT platform FROM receipts")} == {"twilio_backup"}


def test_a_second_sendgrid_accounts_events_are_verified_with_its_own_key(world, monkeypatch):
    primary_key, backup_key = EventKey.generate(), EventKey.generate()
    with FakeSendGrid(api_key="SG.backup.key") as backup:
        configure(
            monkeypatch,
            email_providers="sendgrid,sendgrid_backup",
            sendgrid_webhook_public_key=primary_key.public_key,
            sendgrid_backup_api_key="SG.backup.key",
            sendgrid_backup_api_url=backup.url,
            sendgrid_backup_webhook_public_key=backup_key.public_key,
        )
        world.sendgrid.fail(401)  # the first account refused: certainly not taken
        send(0, "receipt_email", order="E-0")
        [mail] = backup.sent
        url = f"{world.web}/webhooks/sendgrid"
        assert post_events(url, EventKey.generate(), [event(mail, "delivered")])[0] == 401
        assert post_events(url, backup_key, [event(mail, "delivered")])[0] == 200
    [row] = rows("SELECT state, platform, provider_message_id FROM deliveries")
    assert (row["state"], row["platform"]) == ("delivered", "sendgrid_backup")
    assert row["provider_message_id"] == mail.message_id
    assert [r["platform"] for r in rows("SELECT platform FROM receipts")] == ["sendgrid_backup"]
    assert world.sendgrid.sent == [] and [c.status for c in world.sendgrid.calls] == [401]


def test_a_refused_connection_sends_through_smtp_and_records_it(world):
    world.sendgrid.refuse()
    send(0, "receipt_email", order="E-0")
    [mail] = world.smtp.messages
    [row] = rows("SELECT state, platform, provider_message_id FROM deliveries")
    assert (row["state"], row["platform"]) == ("sent", "smtp")
    assert row["provider_message_id"] == mail.message["Message-ID"]
    assert world.sendgrid.sent == [] and rows("SELECT kind FROM incidents") == []


def redis_time() -> float:
    seconds, micros = runtime.redis().time()
    return seconds + micros / 1_000_000


def test_the_circuit_is_shared_and_judged_on_redis_clock(world):
    policy = Policy(failures=2, open_for=OPEN_FOR, probe_for=5.0)
    one, two = (Circuits(RedisBackend(runtime.redis), policy) for _ in range(2))
    one.record("email:x", ok=False)
    opened = two.record("email:x", ok=False)  # another process's failure counts with the first
    assert opened.after.state is State.OPEN
    assert not one.admit("email:x").admitted
    assert abs(opened.after.since - redis_time()) < 5  # stamped by Redis
    deadline = opened.after.since + OPEN_FOR
    while redis_time() < deadline:
        time.sleep(0.05)  # Redis's clock, read: the wait is exactly the policy's
    probe = two.admit("email:x")
    assert probe.admitted and probe.after.state is State.HALF_OPEN
    assert not one.admit("email:x").admitted  # the probe is the only one let through
    assert one.record("email:x", ok=True).after.state is State.CLOSED
