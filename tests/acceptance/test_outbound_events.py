"""Outbound events with real workers (a lanes worker, an events worker, beat) while the app's
endpoint misbehaves (500s, timeouts, answers dropped after taking the event) and recovers, over
notifications with receipts; the events worker is SIGKILLed once right after an endpoint took an
event, and the lanes worker once in a route before its commit (its changes roll back) and once
right after it (the state changed; the sending waits for a takeover).

Counted at the stand-in endpoint (standins/fake_app_endpoint.py): every event arrives and is
acknowledged, every signature is valid, repeats carry the same webhook-id and body, and no event
of a delivery arrives before each earlier event of that delivery was acknowledged. Every event
that arrived names a change that exists (nothing from the rolled-back route)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.records import Receipt
from clarion.standins.fake_app_endpoint import Arrival, FakeAppEndpoint
from clarion.standins.receiver import Receiver
from clarion.tasks import event_endpoints, notify_many, register_recipient
from clarion.tasks.receipts import ingest
from tests.support.cli import ok, refused
from tests.support.cluster import Cluster, counts, wait_settled
from tests.support.pipeline import count, rows

pytestmark = pytest.mark.acceptance
USERS = 20


def run(clarion_env, tmp_path, notifications: int) -> None:
    faults = tmp_path / "faults"
    with (
        Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver,
        FakeAppEndpoint([], hold=1.0) as app,
    ):
        endpoint = event_endpoints.create(app.url, ["*"])
        app.state.secrets.append(endpoint.secret)
        for mode, times in (("500", 6), ("timeout", 2), ("drop", 3), ("500", 4)):
            app.state.script(mode, times)
        env = {
            **clarion_env.env,
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_TICK_INTERVAL": "0.5",
            "CLARION_EVENTS_TIMEOUT": "0.5",
            "CLARION_EVENTS_BATCH": "10",
            "CLARION_EVENTS_FIRST_RETRY": "0.2",
            "CLARION_STRAY_AFTER": "2",  # the killed route's request is published again soon
            "CLARION_CLAIM_LEASE": "3",
            "CLARION_SEND_TIMEOUT": "2",
            "CLARION_FAULTS_DIR": str(faults),
        }
        for u in range(USERS):
            register_recipient(f"u{u}", timezone="UTC")
        cluster = Cluster(env, tmp_path / "logs")
        try:
            cluster.worker(
                "lanes",
                ("transactional", "activation", "control"),
                # one route dies before its commit (its changes roll back), one after it (its
                # claimed deliveries are taken over when the lease runs out, and sent)
                env={"CLARION_FAULTS": "route.before_commit=crash*1,route.after_commit=crash*1"},
            )
            cluster.worker(
                "events", ("events",), env={"CLARION_FAULTS": "events.after_post=crash*1"}
            )
            cluster.beat()
            notify_many(
                [
                    dict(
                        user_id=f"u{n % USERS}",
                        type_key="receipt",
                        event_id=f"e{n}",
                        variables={"order": str(n)},
                    )
                    for n in range(notifications)
                ]
            )
            assert wait_settled(120, expect_sent=notifications), "the pipeline did not settle"
            _receipts()
            expected = counts("SELECT count(*) FROM outbound_events")
            assert _all_acknowledged(app, expected, timeout=120), "events still missing"
        finally:
            cluster.stop_together()
    assert len(list(faults.iterdir())) == 3, "the three kills did not all happen"
    assert app.state.scripted == 0, "the endpoint's misbehaviour was not all used"
    _check(app.state.snapshot(), expected, notifications)


def _receipts() -> None:
    """The provider reports each message delivered, then opened (the web door's ingest)."""
    sent = rows("SELECT user_id, id FROM deliveries WHERE state = 'sent' ORDER BY id")
    for event in ("delivered", "opened"):
        at = datetime.now(UTC)
        ingest(
            Receipt("webhook", event, None, at, user_id=r["user_id"], delivery_id=r["id"])
            for r in sent
        )


def _all_acknowledged(app: FakeAppEndpoint, expected: int, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len({a.msg_id for a in app.state.snapshot() if a.answer == "204"}) >= expected:
            return True
        time.sleep(0.5)
    return False


def _check(arrivals: list[Arrival], expected: int, notifications: int) -> None:
    events = {f"evt_{r['id']}": r for r in rows("SELECT id, kind, stream FROM outbound_events")}
    assert len(events) == expected
    kinds = Counter(e["kind"] for e in events.values())
    assert kinds == {
        "request.accepted": notifications,
        "delivery.sent": notifications,
        "delivery.delivered": notifications,
        "delivery.opened": notifications,
    }
    acked = {a.msg_id for a in arrivals if a.answer == "204"}
    assert acked == set(events)  # every event, acknowledged at least once
    assert all(a.matched == (0,) for a in arrivals)  # every signature valid
    bodies = defaultdict(set)
    for a in arrivals:
        bodies[a.msg_id].add(a.body)
    assert all(len(b) == 1 for b in bodies.values())  # a repeat is the same event
    repeated = [m for m in bodies if sum(x.msg_id == m for x in arrivals) > 1]
    assert repeated, "no event was sent twice: the faults did not bite"
    taken_twice = [
        m for m in bodies if sum(x.msg_id == m and x.answer == "204" for x in arrivals) > 1
    ]
    assert taken_twice, "the event taken before the SIGKILL was not sent again"
    # per delivery (stream): nothing arrives before every earlier event was acknowledged
    by_stream: dict[str, list[int]] = defaultdict(list)
    for msg_id, e in events.items():
        by_stream[e["stream"]].append(int(msg_id.removeprefix("evt_")))
    acked_at: dict[str, float] = {}
    for a in arrivals:
        seq = int(a.msg_id.removeprefix("evt_"))
        stream = events[a.msg_id]["stream"]
        earlier = [f"evt_{s}" for s in by_stream[stream] if s < seq]
        assert all(m in acked_at and acked_at[m] <= a.at for m in earlier), (a.msg_id, stream)
        if a.answer == "204":
            acked_at.setdefault(a.msg_id, a.at)
    # no event for a change that does not exist (the killed route's rolled back)
    assert (
        counts(
            "SELECT count(*) FROM outbound_events e WHERE e.delivery_id IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM deliveries d WHERE d.user_id = e.user_id AND d.id = e.delivery_id)"
        )
        == 0
    )


def test_events_arrive_once_or_more_signed_and_in_order_per_delivery(clarion_env, tmp_path):
    run(clarion_env, tmp_path, notifications=120)


@pytest.mark.soak
def test_two_thousand_notifications_with_a_misbehaving_endpoint(clarion_env, tmp_path):
    run(clarion_env, tmp_path, notifications=2000)


def _cli(clarion_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "clarion"), *args],
        env={**os.environ, **clarion_env.env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_registers_rotates_disables_enables_replays_and_removes(clarion_env):
    register_recipient("ann", timezone="UTC")
    secret = ok(
        _cli(
            clarion_env,
            "events",
            "endpoints",
            "add",
            "https://a.example/h",
            "--kind",
            "request.accepted",
        )
    ).strip()
    assert secret.startswith("whsec_")
    [endpoint] = rows("SELECT id, secret FROM webhook_endpoints")
    assert endpoint["secret"] == secret
    one = str(endpoint["id"])
    assert re.search(
        rf"^{one}\thttps://a.example/h\tenabled\trequest.accepted$",
        ok(_cli(clarion_env, "events", "endpoints", "list")),
        re.M,
    )
    assert "DISABLED (disabled by hand)" in ok(
        _cli(clarion_env, "events", "endpoints", "disable", one)
    )
    assert "\tenabled\t" in ok(_cli(clarion_env, "events", "endpoints", "enable", one))
    rotated = ok(_cli(clarion_env, "events", "endpoints", "rotate", one, "--overlap", "1h")).strip()
    [row] = rows("SELECT secret, previous_secret FROM webhook_endpoints")
    assert (row["secret"], row["previous_secret"]) == (rotated, secret)
    from clarion.tasks import notify

    notify("ann", "receipt", event_id="e1", variables={"order": "1"})
    with engine().begin() as conn:
        conn.execute(text("UPDATE outbound_sends SET state = 'delivered'"))
    assert ok(_cli(clarion_env, "events", "replay", "--since", "1h")).startswith("1 events")
    assert count("outbound_sends", "state = 'pending'") == 1
    assert refused(_cli(clarion_env, "events", "replay", "--since", "yesterday")).startswith(
        "clarion: --since takes an ISO time"
    )
    assert refused(
        _cli(clarion_env, "events", "endpoints", "add", "https://a.example/", "--kind", "x")
    ).startswith("clarion: kinds: unknown event kind 'x'")
    ok(_cli(clarion_env, "events", "endpoints", "remove", one))
    assert refused(_cli(clarion_env, "events", "endpoints", "remove", one)) == (
        f"clarion: no webhook endpoint {one}"
    )
    assert count("webhook_endpoints") == 0 and count("outbound_sends") == 0
