"""`clarion demo`: the whole pipeline on the embedded default, with real worker and beat processes.

It sends a scenario with repeated events, re-published (redelivered) tasks, a worker killed mid-run
and a crash right after a provider accepted a message, then prints what was requested, sent,
not sent (with reasons) and prevented.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sys
import time
from pathlib import Path

import redis as redis_lib
from sqlalchemy import make_url, text

from clarion import settings
from clarion.errors import ClarionError
from clarion.ops import demo_chat, demo_digest, demo_escalation, demo_receipts, launch
from clarion.ops.table import render
from clarion.standins.fake_slack import FakeSlack
from clarion.standins.receiver import Receiver

DATABASE = "clarion_demo"
ARRIVALS = "demo-receiver.json"  # in CLARION_HOME: what the webhook receiver took
RECIPIENTS = 120
ZONES = ["Europe/Berlin", "America/New_York", "Asia/Jerusalem", "Asia/Tokyo", "Australia/Sydney"]


def say(message: str) -> None:
    print(message, flush=True)


def _prepare_database(server_url: str) -> str:
    from clarion.db.engine import migrate, one_off_engine

    with one_off_engine(server_url).connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
    url = make_url(server_url).set(database=DATABASE).render_as_string(hide_password=False)
    migrate(url)
    return url


def _scenario(rng: random.Random) -> list[dict]:
    items = []
    for n in range(RECIPIENTS):
        user = f"user-{n:03d}"
        items.append(
            dict(
                user_id=user,
                type_key="order_receipt",
                event_id=f"order-{n}",
                variables={"order_number": f"A-{1000 + n}", "total": f"€{rng.randint(5, 90)}.00"},
            )
        )
        items.append(
            dict(
                user_id=user,
                type_key="plan_kickoff",
                occurrence_key="plan:1",
                variables={"first_name": f"Manager {n}", "plan_name": "Growth"},
            )
        )
        if n % 3 == 0:
            items.append(
                dict(
                    user_id=user,
                    type_key="password_reset",
                    event_id=f"reset-{n}",
                    variables={"code": f"{rng.randint(0, 999999):06d}"},
                )
            )
        if n % 2 == 0:
            items.append(
                dict(
                    user_id=user,
                    type_key="stalled_plan",
                    occurrence_key="stalled:week-48",
                    variables={"first_name": f"Manager {n}"},
                )
            )
    return items


def _wait(url: str, expected_requests: int, timeout: float) -> bool:
    from clarion.db import reports
    from clarion.db.engine import engine

    deadline = time.monotonic() + timeout
    tty, next_line = sys.stdout.isatty(), 0.0
    while time.monotonic() < deadline:
        with engine(url).connect() as conn:
            pending, unsettled, sent = reports.progress(conn)
        line = (
            f"  routed {expected_requests - pending}/{expected_requests} requests, "
            f"{sent} deliveries sent, {unsettled} in flight"
        )
        if pending == 0 and unsettled == 0:
            say(("\r" if tty else "") + line)
            return True
        if tty:
            sys.stdout.write("\r" + line + "   ")
            sys.stdout.flush()
        elif time.monotonic() >= next_line:
            say(line)
            next_line = time.monotonic() + 2
        time.sleep(0.25)
    say("")
    return False


def _webhook_secret() -> str:
    """CLARION_WEBHOOK_SECRET if it was given, else a fresh one for this demo."""
    secret = settings.get().webhook_secret
    return f"demo-{secrets.token_hex(8)}" if secret == settings.DEV_WEBHOOK_SECRET else secret


def run(home: Path) -> int:
    from clarion.db.embedded import ensure_running

    started = time.monotonic()
    say("clarion demo — starting embedded PostgreSQL and Redis")
    services = ensure_running(home)
    processes: list[launch.Process] = []
    try:
        url = _prepare_database(services.database_url)
        redis_lib.Redis.from_url(services.redis_url).flushdb()
        secret = _webhook_secret()
        with (
            Receiver(secret) as receiver,
            FakeSlack() as slack,
            demo_receipts.providers() as providers,
        ):
            env = {
                **demo_chat.env(slack),
                **providers.env(),
                "CLARION_HOME": str(home),
                "CLARION_WEBHOOK_SECRET": secret,  # the public dev secret is refused with a database URL
                "CLARION_DATABASE_URL": url,
                "CLARION_REDIS_URL": services.redis_url,
                "CLARION_WEBHOOK_URL": receiver.url,
                "CLARION_CLAIM_LEASE": "4",
                "CLARION_STRAY_AFTER": "3",
                "CLARION_BATCH_SIZE": "50",
                # crash once right after a provider accepted a message, before "sent" is recorded
                "CLARION_FAULTS": "deliver.after_send=crash*1",
                "CLARION_FAULTS_DIR": str(home / "demo-faults"),
            }
            _clear_faults(home / "demo-faults")
            os.environ.update({k: v for k, v in env.items() if k != "CLARION_FAULTS"})
            settings.reset()
            processes = _start_processes(home, env)
            return _play(
                url, services.redis_url, receiver, processes, home, env, started, slack, providers
            )
    except ClarionError as exc:
        say(f"demo failed: {exc}")
        return 1
    finally:
        for p in processes:
            p.stop()
        services.stop()
        say("stopped workers, beat and embedded services")


def _clear_faults(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()


def _start_processes(home: Path, env: dict[str, str]) -> list[launch.Process]:
    logs = home / "demo-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for f in logs.iterdir():
        f.unlink()
    say(f"starting 3 workers (lanes: transactional, activation, control) and beat; logs in {logs}")
    return [
        launch.Process(
            launch.worker_command(["transactional"], name="transactional", loglevel="INFO"),
            env=env,
            log=logs / "transactional.log",
        ),
        launch.Process(
            launch.worker_command(["activation"], name="activation", loglevel="INFO"),
            env=env,
            log=logs / "activation.log",
        ),
        launch.Process(
            launch.worker_command(["control"], concurrency=1, name="control"),
            env=env,
            log=logs / "control.log",
        ),
        launch.Process(launch.beat_command(home), env=env, log=logs / "beat.log"),
    ]


def _play(url, redis_url, receiver, processes, home, env, started, slack, providers) -> int:
    from clarion.tasks import notify, notify_many, register_recipient
    from clarion.tasks.publish import DELIVER, ROUTE, publish

    rng = random.Random(7)
    say(f"registering {RECIPIENTS} recipients in {len(ZONES)} time zones")
    for n in range(RECIPIENTS):
        register_recipient(f"user-{n:03d}", timezone=ZONES[n % len(ZONES)])
    items = _scenario(rng)
    say(f"requesting {len(items)} notifications (notify_many, in batches of 100)")
    for start in range(0, len(items), 100):
        notify_many(items[start : start + 100])
    demo_digest.send(say)

    say("bad input fails loudly at notify() and writes nothing:")
    for call in (
        lambda: notify("user-000", "no_such_type", event_id="x"),
        lambda: notify("user-000", "order_receipt", event_id="x", variables={"order_number": "1"}),
        lambda: notify("nobody", "password_reset", event_id="x", variables={"code": "1"}),
        lambda: register_recipient("user-x", timezone="Mars/Olympus_Mons"),
    ):
        try:
            call()
        except ClarionError as exc:
            say(f"  {type(exc).__name__}: {exc}")

    repeats = rng.sample(items, 150)
    say(f"repeating {len(repeats)} events (the producer retried them)")
    again = notify_many(repeats)
    assert not any(e.new for e in again)

    say("killing the activation worker with SIGKILL and starting a new one")
    time.sleep(1.0)
    processes[1].kill()
    processes[1] = launch.Process(
        processes[1].command, env=env, log=home / "demo-logs" / "activation-2.log"
    )

    say("re-publishing route and deliver tasks for work already done (redelivered messages)")
    from clarion.db.engine import engine

    with engine(url).connect() as conn:
        reqs = conn.execute(
            text("SELECT user_id, id, lane FROM requests ORDER BY random() LIMIT 300")
        ).all()
        dels = conn.execute(
            text("SELECT user_id, id, lane FROM deliveries ORDER BY random() LIMIT 300")
        ).all()
    publish(ROUTE, reqs)
    publish(DELIVER, dels)

    done = _wait(
        url,
        len(
            {
                (i["user_id"], i["type_key"], i.get("event_id") or i.get("occurrence_key"))
                for i in items
            }
        )
        + len(demo_digest.REPLIES),
        timeout=45,
    )
    digest = demo_digest.wait(url, say)
    time.sleep(1.0)  # let the re-published messages drain so the counters are complete
    _summary(url, redis_url, receiver, len(items), len(repeats))
    chat = demo_chat.run(slack, say)
    receipts = demo_receipts.run(providers, say)
    escalated = demo_escalation.run(providers, receiver, say)
    _keep_arrivals(receiver, home / ARRIVALS)
    say(
        f"finished in {time.monotonic() - started:.1f} s" + ("" if done else " (timed out waiting)")
    )
    return 0 if done and chat and receipts and escalated and digest else 1


def _keep_arrivals(receiver: Receiver, path: Path) -> None:
    """Write what the webhook receiver took (arrivals per idempotency key, the delivery id each
    key carried, the keys per occurrence) for a reader after the demo, like its database."""
    a = receiver.arrivals
    with a.lock:
        kept = {
            "by_key": dict(a.by_key),
            "deliveries": dict(a.deliveries),
            "occurrences": {o: sorted(keys) for o, keys in a.occurrences.items()},
        }
    path.write_text(json.dumps(kept, indent=1, sort_keys=True))


def _summary(url: str, redis_url: str, receiver: Receiver, requested: int, repeated: int) -> None:
    from clarion.db import reports
    from clarion.db.engine import engine
    from clarion.ops.stats import counters

    with engine(url).connect() as conn:
        deliveries = reports.delivery_counts(conn)
        decisions = reports.decision_counts(conn)
        incidents = reports.incident_counts(conn)
    count = counters(redis_url)
    by_channel: dict[str, int] = {}
    for _, channel, state, n in deliveries:
        if state == "sent":
            by_channel[channel] = by_channel.get(channel, 0) + n
    sent = sum(by_channel.values())
    a = receiver.arrivals
    rows = [
        ("notifications requested", requested),
        ("  repeated events (returned the existing request)", repeated),
        ("deliveries sent", sent),
        *((f"  sent on {channel}", n) for channel, n in sorted(by_channel.items())),
        *((f"not delivered: {reason} ({gate})", n) for gate, _, reason, n in decisions),
        (
            "duplicates prevented",
            repeated
            + count.get("route_skipped_already_resolved", 0)
            + count.get("deliver_skipped_not_claimable", 0),
        ),
        (
            "  re-published route tasks that found the request resolved",
            count.get("route_skipped_already_resolved", 0),
        ),
        (
            "  deliver tasks that found nothing claimable",
            count.get("deliver_skipped_not_claimable", 0),
        ),
        *((f"incident: {kind}", n) for kind, n in incidents),
        *demo_digest.rows(url),
        ("webhook receiver: arrivals", a.total),
        ("webhook receiver: distinct idempotency keys", a.unique),
        ("webhook receiver: repeats it dropped by idempotency key", a.repeats),
        (
            "occurrences that arrived under two different keys",
            sum(1 for keys in a.occurrences.values() if len(keys) > 1),
        ),
    ]
    say("")
    say(render(["", "count"], rows, "clarion demo — results"))
