"""The activation window and the fatigue caps under real worker processes, counted at the receiver.

Four worker processes (two workers, two processes each) route the activation lane; with
CLARION_BATCH_SIZE=1 every request is its own message, so the requests of one recipient are
routed by different processes at the same moment. A short sleep before each route commits keeps
the transactions overlapping, so losers meet the winner's uncommitted claim, not its committed row.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from clarion import settings
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many, register_recipient
from tests.support.cluster import Cluster, counts
from tests.support.gates import GATES, rows, use_gates_catalog

pytestmark = pytest.mark.acceptance

ENV = {
    "CLARION_BATCH_SIZE": "1",
    "CLARION_TICK_INTERVAL": "0.5",
    "CLARION_STRAY_AFTER": "20",
    "CLARION_CATALOG": str(GATES),
}
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
WORKERS = ("activation-1", "activation-2", "control")


def _zones_away_from_midnight() -> list[str]:
    """Zones where this test cannot straddle local midnight (the caps count per local day)."""
    now = datetime.now(UTC)
    local = {z: now.astimezone(ZoneInfo(z)) for z in ZONES}
    zones = [
        z
        for z, t in local.items()
        if (t.hour, t.minute) >= (0, 10) and (t.hour, t.minute) < (23, 50)
    ]
    assert len(zones) >= 5
    return zones


@pytest.fixture
def cluster(clarion_env, monkeypatch, tmp_path: Path) -> Iterator[Callable[[float], Receiver]]:
    """Starts two activation workers (2 processes each, holding every route transaction open
    `overlap` seconds before it commits), a control worker and beat, on the gate catalog; returns
    the receiver they send to."""
    use_gates_catalog(monkeypatch)
    monkeypatch.setenv("CLARION_BATCH_SIZE", "1")  # this process publishes one request per message
    settings.reset()
    logs = tmp_path / "logs"
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        c = Cluster({**clarion_env.env, **ENV, "CLARION_WEBHOOK_URL": receiver.url}, logs)

        def start(overlap: float) -> Receiver:
            faults = {"CLARION_FAULTS": f"route.before_commit=sleep:{overlap}"}
            c.worker("activation-1", ["activation"], concurrency=2, env=faults)
            c.worker("activation-2", ["activation"], concurrency=2, env=faults)
            c.worker("control", ["control"], concurrency=1)
            c.beat()
            c.wait_ready(WORKERS, 60)
            return receiver

        try:
            yield start
        finally:
            c.stop_together()


def _wait_routed_and_sent(requests: int, timeout: float) -> None:
    """Until `requests` (summaries aside) are routed and no delivery is pending or claimed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        routed = counts(
            "SELECT count(*) FROM requests WHERE state = 'routed' AND type_key <> 'daily_summary'"
        )
        unsettled = counts("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'claimed')")
        if routed == requests and unsettled == 0:
            return
        time.sleep(0.25)
    raise AssertionError(
        f"not settled in {timeout} s: {routed} of {requests} routed, {unsettled} unsettled"
    )


def _per_user(receiver: Receiver, type_keys: set[str]) -> Counter:
    with receiver.arrivals.lock:
        occurrences = list(receiver.arrivals.occurrences)
    return Counter(o.split("/")[0] for o in occurrences if o.split("/")[1] in type_keys)


def test_two_nudges_at_the_same_instant_by_four_processes_send_exactly_one(cluster):
    receiver = cluster(0.02)
    zones = _zones_away_from_midnight()
    users = [f"w{n}" for n in range(200)]
    for n, user in enumerate(users):
        register_recipient(user, timezone=zones[n % len(zones)])
    pairs = [("kickoff", "stalled_plan"), ("stalled_plan", "kickoff")]  # either may come first
    notify_many(
        [
            dict(user_id=u, type_key=k, event_id=f"{u}-{k}")
            for n, u in enumerate(users)
            for k in pairs[n % 2]
        ]
    )
    _wait_routed_and_sent(400, 90)

    arrived = _per_user(receiver, {"kickoff", "stalled_plan"})
    assert arrived == Counter({u: 1 for u in users}), "a recipient got both nudges, or neither"
    assert receiver.arrivals.repeats == 0 and receiver.arrivals.rejected == 0
    sent = rows("SELECT user_id, type_key, request_id FROM deliveries WHERE state = 'sent'")
    assert sorted(u for u, _, _ in sent) == sorted(users)
    assert counts("SELECT count(*) FROM deliveries WHERE state <> 'sent'") == 0
    blocked = rows(
        "SELECT r.user_id, r.type_key, d.gate, d.outcome, d.reason FROM requests r "
        "JOIN decisions d ON d.user_id = r.user_id AND d.request_id = r.id"
    )
    assert len(blocked) == 200
    winner = {u: t for u, t, _ in sent}
    for user, type_key, *decision in blocked:
        assert decision == ["activation_window", "suppress", "activation_window"]
        assert type_key != winner[user]
    # the window names the request that was sent
    assert sorted(rows("SELECT user_id, type_key, request_id FROM activation_windows")) == sorted(
        sent
    )
    assert counts("SELECT count(*) FROM incidents") == 0
    # the race was real: for many recipients both routes ran at once (each holds its transaction
    # open 20 ms, and routed_at is when it started)
    overlapped = counts(
        "SELECT count(*) FROM (SELECT user_id FROM requests GROUP BY user_id "
        "HAVING max(routed_at) - min(routed_at) < interval '20 milliseconds') o"
    )
    assert overlapped >= 10, overlapped
    print(f"\nwinners: {Counter(winner.values())}; routed within 20 ms of each other: {overlapped}")


def test_eight_tips_each_by_four_processes_never_pass_the_caps(cluster):
    # A recipient's tips queue back to back, so their routes contend for one counter row: the
    # overlap is kept short, or they mostly wait on each other.
    receiver = cluster(0.005)
    zones = _zones_away_from_midnight()
    users = [f"c{n}" for n in range(200)]
    org_members = set(users[:40])  # 40 × 3 would pass their own caps: the organisation's 50 binds
    zone_of = {u: zones[n % len(zones)] for n, u in enumerate(users)}
    for user in users:
        register_recipient(
            user, timezone=zone_of[user], org_id="acme" if user in org_members else None
        )
    notify_many(
        [
            dict(user_id=u, type_key="tip", event_id=f"{u}-{n}", variables={"n": n})
            for u in users
            for n in range(8)
        ]
    )
    _wait_routed_and_sent(1600, 100)

    sent = rows("SELECT user_id, created_at FROM deliveries WHERE state = 'sent'")
    per_day = Counter((u, at.astimezone(ZoneInfo(zone_of[u])).date()) for u, at in sent)
    assert max(per_day.values()) <= 3, "more than 3 tips on one local day"
    org_hours = Counter(
        at.astimezone(UTC).strftime("%Y-%m-%dT%H") for u, at in sent if u in org_members
    )
    assert max(org_hours.values()) <= 50, "the organisation got more than 50 in an hour"
    if len(org_hours) == 1:  # (unless the run straddled an hour) the organisation's cap was reached
        assert sum(org_hours.values()) == 50
    arrived = _per_user(receiver, {"tip"})
    assert arrived == Counter(u for u, _ in sent), "the receiver and the ledger disagree"
    assert receiver.arrivals.repeats == 0 and receiver.arrivals.rejected == 0

    folded = Counter(
        u
        for (u,) in rows(
            "SELECT user_id FROM decisions WHERE gate = 'fatigue_cap' AND outcome = 'fold' "
            "AND reason = 'fatigue_cap' AND detail LIKE '%folded into the % summary'"
        )
    )
    assert counts("SELECT count(*) FROM decisions") == sum(folded.values())  # nothing else decided
    summary = defaultdict(list)
    for user, state, variables in rows(
        "SELECT user_id, state, variables FROM requests WHERE type_key = 'daily_summary'"
    ):
        summary[user].append((state, variables["count"], variables["types"]))
    sent_per_user = Counter(u for u, _ in sent)
    for user in users:
        assert sent_per_user[user] + folded[user] == 8, user
        assert summary[user] == [("deferred", folded[user], ["tip"])], user  # one per recipient
        if user not in org_members:
            assert sent_per_user[user] == 3, user
