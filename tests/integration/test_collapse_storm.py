"""The storm (issue 11, must show): 1,800 alert events in 4 minutes for one organisation with a
collapse key and an organisation cap, on an injected clock, through the real route and deliver
code, the update job, PostgreSQL, Redis and the real slack_sdk against the local Slack.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from clarion.standins.fake_slack import FakeSlack
from clarion.tasks import notify_many, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.refresh import refresh_due
from clarion.tasks.route import route
from tests.support.environment import ROOT
from tests.support.pipeline import (
    configure,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

CATALOG = ROOT / "tests" / "catalog_collapse.yaml"
START = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)  # the storm stays inside one UTC hour
ONCALL = ("oncall-a", "oncall-b", "oncall-c")  # org "acme"; route batches sort them in this order
STEP, STEPS = 2, 120  # an event batch every 2 s, t = 0 … 238 s
PER_USER = 5  # events per recipient per batch: 15 a batch, 1,800 in all


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        server.limit("chat.update", 50, 60.0)  # Slack's Tier 3, enforced on Slack's side
        yield server


@pytest.fixture
def storm(clarion_env, fake, monkeypatch) -> Iterator[None]:
    configure(monkeypatch, catalog=CATALOG, slack_token=FakeSlack.TOKEN, slack_api_url=fake.api_url)
    with publishing_to_this_tests_broker():
        yield
        drain("transactional")
        drain("activation")


def _deliver_pending() -> int:
    found = rows("SELECT user_id, id FROM deliveries WHERE state = 'pending'")
    return deliver([r["user_id"] for r in found], [r["id"] for r in found]) if found else 0


def test_1800_alerts_in_4_minutes_make_10_messages_kept_current_by_30_updates(storm, fake):
    """The rules: `cpu_alert` collapses on its cluster for 60 s (one key, "cpu:prod"); the
    organisation may receive 10 non-critical notifications an hour; the overflow folds into each
    recipient's daily summary. Three on-call recipients of org acme get 5 events every 2 s
    (t = 0 … 238 s, 1,800 events).

    Messages: each recipient leads a new group whenever the last one's window has closed, at
    t = 0, 60, 120 and 180 s — 12 leaders, each spending the org's hourly cap. Slots 1–9 go at
    t = 0, 60, 120; at t = 180 oncall-a takes slot 10 and oncall-b and -c find the cap spent: their
    events from then on (30 batches × 5 = 150 each) fold into their summaries. So **10 alert
    messages** now (+ 2 daily summaries, due at midnight, counting 150 each), and 1,800 − 10 − 300
    = **1,490 followers** recorded `collapsed into <leader>`, each group 30 batches × 5 = 150
    events (149 followers + its leader). A follower of an open group spends no cap: oncall-a's
    last group collapses although the cap is spent.

    Updates: the first followers (in the leader's own batch, t = L) owe the leader's message an
    update by L + 20 (update_seconds); the update at L + 20 shows 11 batches × 5 = 55; the next
    follower (L + 22) owes one by L + 42: 110; the follower at L + 44 finds the closing update at
    the window's end, L + 60, sooner: 150, final. **3 chat.update calls per message, 30 in all**,
    instead of one per follower (1,490): about 9 a minute, well inside Slack's Tier 3 (50 a
    minute, enforced by the local Slack here: no 429)."""
    for n, user in enumerate(ONCALL):
        register_recipient(user, timezone="UTC", org_id="acme", addresses={"slack": f"U{n}"})
    with frozen_clock(START) as clock:
        for step in range(STEPS):
            clock.now = START + timedelta(seconds=step * STEP)
            items = [
                {
                    "user_id": user,
                    "type_key": "cpu_alert",
                    "event_id": f"{user}-{step}-{k}",
                    "variables": {"host": f"h{step * 15 + n * PER_USER + k}", "cluster": "prod"},
                }
                for n, user in enumerate(ONCALL)
                for k in range(PER_USER)
            ]
            made = notify_many(items)
            route([i["user_id"] for i in items], [m.request_id for m in made])
            _deliver_pending()
            refresh_due()
            if step == 0:  # the first is delivered at once, not held for its window
                assert [p.text.split("\n")[0] for p in fake.posts()] == [
                    "CRITICAL: CPU alerts on 1 host"
                ] * 3
        clock.now = START + timedelta(seconds=STEPS * STEP)  # 10:04:00: the last window closes
        refresh_due()

    assert rows("SELECT count(*) AS n FROM requests WHERE type_key = 'cpu_alert'")[0]["n"] == 1800
    sent = rows(
        "SELECT d.user_id, d.request_id, d.sent_at, d.state FROM deliveries d "
        "JOIN requests q ON q.user_id = d.user_id AND q.id = d.request_id "
        "WHERE q.type_key = 'cpu_alert' ORDER BY d.sent_at, d.user_id"
    )
    assert len(sent) == 10 and {r["state"] for r in sent} == {"sent"}
    assert sent[0]["sent_at"] == START  # the very first event went out at t = 0
    leads = Counter(r["user_id"] for r in sent)
    assert leads == {"oncall-a": 4, "oncall-b": 3, "oncall-c": 3}

    reasons = rows("SELECT reason, count(*) AS n FROM decisions GROUP BY reason ORDER BY reason")
    assert {r["reason"]: r["n"] for r in reasons} == {"collapsed": 1490, "fatigue_cap": 300}
    details = rows("SELECT detail FROM decisions WHERE reason = 'collapsed'")
    per_leader = Counter(
        re.match(r"collapsed into request (\d+) ", d["detail"])[1] for d in details
    )
    assert sorted(per_leader) == sorted(str(r["request_id"]) for r in sent)
    assert set(per_leader.values()) == {149}
    assert rows("SELECT scope, count FROM fatigue_counters WHERE scope = 'org:acme'") == [
        {"scope": "org:acme", "count": 10}
    ]
    summaries = rows(
        "SELECT user_id, state, due_at, variables->>'count' AS n FROM requests "
        "WHERE type_key = 'daily_summary' ORDER BY user_id"
    )
    midnight = datetime(2026, 12, 8, tzinfo=UTC)
    assert summaries == [
        {"user_id": u, "state": "deferred", "due_at": midnight, "n": "150"}
        for u in ("oncall-b", "oncall-c")
    ]

    posts = fake.posts()
    assert len(posts) == 10 and len(fake.called("chat.postMessage", ok=True)) == 10
    for post in posts:
        assert [t.split("\n")[0] for t in post.update_texts] == [
            "CRITICAL: CPU alerts on 55 hosts (and counting)",
            "CRITICAL: CPU alerts on 110 hosts (and counting)",
            "CRITICAL: CPU alerts on 150 hosts",
        ]
    assert len(fake.called("chat.update", ok=True)) == 30
    assert fake.throttled("chat.update") == 0
    owed = rows("SELECT count(*) AS n FROM collapse_refreshes WHERE due_at IS NOT NULL")
    assert owed == [{"n": 0}]  # every message shows its group's final count
