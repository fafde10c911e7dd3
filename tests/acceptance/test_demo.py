"""`clarion demo`, as a newcomer runs it (`make demo`): a real subprocess on its own embedded
PostgreSQL and Redis. Graded on what it did: the `clarion_demo` database it leaves under
CLARION_HOME (read here after the run, on the same embedded services started again) and what its
webhook receiver took (ops/demo.py keeps that in CLARION_HOME/demo-receiver.json). The tables it
prints are checked last, and only against those facts. In the soak tier (CI runs it once): it takes
about a minute and starts its own services."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Connection, text

from clarion.db.embedded import ensure_running
from clarion.db.engine import dispose_all, engine
from clarion.ops.demo import ARRIVALS, DATABASE, RECIPIENTS
from clarion.ops.demo_digest import BUYER, REPLIES
from clarion.records import idempotency_key
from tests.support.environment import ROOT, with_database

pytestmark = [pytest.mark.acceptance, pytest.mark.soak]

CLARION = Path(sys.executable).parent / "clarion"
SCENARIO = {  # requests per type for the user-NNN recipients (ops/demo.py _scenario)
    "order_receipt": RECIPIENTS,
    "plan_kickoff": RECIPIENTS,
    "password_reset": len(range(0, RECIPIENTS, 3)),
    "stalled_plan": len(range(0, RECIPIENTS, 2)),
}
ACTIVATION = ("plan_kickoff", "stalled_plan")  # one per recipient per 48 h: the window gate


@pytest.fixture
def home() -> Iterator[Path]:
    """The demo's CLARION_HOME, outside pytest's temporary root: that folder is reset to mode 0700
    whenever a pytest session starts, and the embedded PostgreSQL (run as its own user) could then
    no longer reach its data when started again after the run."""
    folder = ROOT / ".clarion" / f"demo-test-{uuid.uuid4().hex[:8]}"
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def demo_database(home: Path) -> Iterator[Connection]:
    """The demo's database, on its embedded services started again in the same folder."""
    services = ensure_running(home)
    try:
        with engine(with_database(services.database_url, DATABASE)).connect() as conn:
            yield conn
    finally:
        dispose_all()
        services.stop()


def _all(conn: Connection, sql: str, **params) -> list[tuple]:
    return [tuple(r) for r in conn.execute(text(sql), params)]


_DELIVERIES = """
    SELECT r.user_id, r.type_key, r.occurrence_key, d.channel, d.state, d.id, d.answer
    FROM deliveries d JOIN requests r ON r.user_id = d.user_id AND r.id = d.request_id
"""


def _count(output: str, label: str) -> int:
    """The count column of the results-table row that starts with `label`."""
    found = re.search(rf"^{re.escape(label)}\s+(\d+)\s*$", output, re.MULTILINE)
    assert found, f"no row {label!r} in the demo's results table"
    return int(found.group(1))


def test_the_demo_sends_each_notification_once_digests_and_escalates(home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    env["CLARION_HOME"] = str(home)
    run = subprocess.run(
        [str(CLARION), "demo"], env=env, capture_output=True, text=True, timeout=600
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "Traceback" not in out

    with demo_database(home) as conn:
        deliveries = _all(conn, _DELIVERIES)
        requests = _all(conn, "SELECT user_id, type_key, state FROM requests")
        decisions = _all(
            conn,
            "SELECT user_id, request_id, gate, outcome, reason, detail FROM decisions ORDER BY id",
        )
        incidents = _all(
            conn,
            "SELECT i.kind, d.channel, d.state FROM incidents i "
            "JOIN deliveries d ON d.user_id = i.user_id AND d.id = i.delivery_id",
        )
        chains = dict(
            (u, (s, a))
            for u, s, a in _all(conn, "SELECT user_id, state, acked_by FROM escalations")
        )
        digest = _all(
            conn,
            "SELECT id, variables->>'summary' FROM requests WHERE user_id = :u "
            "AND type_key = 'replies_digest'",
            u=BUYER,
        )
    arrivals = json.loads((home / ARRIVALS).read_text())

    # every request was routed; repeated events and re-published tasks added no request
    assert {state for *_, state in requests} == {"routed"}
    scenario = Counter(t for u, t, _ in requests if u.startswith("user-"))
    assert scenario == SCENARIO

    # never two deliveries for one (user, type, occurrence, channel), in any state
    per_key = Counter((u, t, o, c) for u, t, o, c, *_ in deliveries)
    assert [k for k, n in per_key.items() if n > 1] == []

    # the scenario's deliveries, by type, channel and state: everything allowed was sent...
    scenario_rows = [row for row in deliveries if row[0].startswith("user-")]
    by_state = Counter((t, c, s) for _, t, _, c, s, *_ in scenario_rows if t not in ACTIVATION)
    assert by_state == {
        ("order_receipt", "webhook", "sent"): SCENARIO["order_receipt"],
        ("password_reset", "webhook", "sent"): SCENARIO["password_reset"],
        ("password_reset", "console", "sent"): SCENARIO["password_reset"],
    }
    # ...and each recipient got exactly one activation nudge; the other one, for those with
    # two, was suppressed by the activation window, with that reason recorded
    activation = Counter(u for u, t, *_, s, _, _ in scenario_rows if t in ACTIVATION)
    assert {s for _, t, _, _, s, *_ in scenario_rows if t in ACTIVATION} == {"sent"}
    assert activation == {f"user-{n:03d}": 1 for n in range(RECIPIENTS)}
    windowed = Counter(u for u, _, gate, *_ in decisions if gate == "activation_window")
    assert windowed == {f"user-{n:03d}": 1 for n in range(0, RECIPIENTS, 2)}
    assert {(o, r) for _, _, g, o, r, _ in decisions if g == "activation_window"} == {
        ("suppress", "activation_window")
    }
    # the crash right after a provider accepted a message (it takes the worker's sends in
    # flight with it) is recorded, not hidden: each send made again is an incident, `repeat`
    # where the receiver had the key and dropped the second arrival
    assert incidents, "the crash after a send left no incident"
    assert {(k, s) for k, _, s in incidents} <= {("repeat", "sent"), ("possible_duplicate", "sent")}
    assert {c for k, c, _ in incidents if k == "repeat"} <= {"webhook"}
    dropped = sum(n - 1 for n in arrivals["by_key"].values())
    assert dropped == sum(1 for k, *_ in incidents if k == "repeat")

    # the digest: 7 replies buffered into one request, which went out as one webhook message
    [(digest_id, summary)] = digest
    assert summary == "3 sellers replied to you (7 new messages)"
    buffered = [(o, r, d) for u, _, g, o, r, d in decisions if u == BUYER and g == "digest"]
    assert len(buffered) == len(REPLIES)
    assert {(o, r) for o, r, _ in buffered} == {("digest", "digested")}
    assert all(d.startswith(f"digested into request {digest_id} ") for *_, d in buffered), buffered
    assert [(c, s) for u, t, _, c, s, *_ in deliveries if u == BUYER] == [("webhook", "sent")]

    # escalation: acked at once -> nothing more; no ack -> SMS then the secondary; a dead
    # number -> the secondary at once after the SMS failed
    assert chains["oncall-ana"][0] == "acked" and "slack answer 'ack'" in chains["oncall-ana"][1]
    assert chains["oncall-bo"] == ("finished", None) and chains["oncall-cy"] == ("finished", None)
    steps = {
        user: [(o, r) for u, _, g, o, r, _ in decisions if u == user and g == "escalation"]
        for user in chains
    }
    assert steps["oncall-ana"] == [("wait", "no_ack"), ("stop", "acked")]
    assert steps["oncall-bo"] == [
        ("wait", "no_ack"),
        ("escalate", "no_ack"),
        ("escalate", "step_of_chain"),
        ("escalate", "no_ack"),
        ("stop", "chain_finished"),
    ]
    assert steps["oncall-cy"] == [
        ("wait", "no_ack"),
        ("escalate", "no_ack"),
        ("escalate", "step_of_chain"),
        ("hurry", "step_failed"),
        ("escalate", "step_failed"),
        ("stop", "chain_finished"),
    ]
    paged = Counter((u, t, c, s) for u, t, _, c, s, *_ in deliveries if u.startswith("oncall-"))
    assert paged == {
        ("oncall-ana", "oncall_page", "slack", "answered"): 1,
        ("oncall-bo", "oncall_page", "slack", "sent"): 1,
        ("oncall-bo", "oncall_sms", "sms", "sent"): 1,
        ("oncall-cy", "oncall_page", "slack", "sent"): 1,
        ("oncall-cy", "oncall_sms", "sms", "undelivered"): 1,
        ("oncall-sam", "oncall_secondary", "webhook", "sent"): 2,
    }
    # the chat part: the goal prompt was answered once, with the first click's answer
    assert [(s, a) for u, t, _, _, s, _, a in deliveries if t == "goal_prompt"] == [
        ("answered", "ship_faster")
    ]

    # the webhook receiver took exactly the webhook deliveries recorded sent: one idempotency
    # key each, carrying its delivery's id, and no occurrence under two keys
    webhook_sent = {
        idempotency_key(u, t, o, c): d
        for u, t, o, c, s, d, _ in deliveries
        if c == "webhook" and s == "sent"
    }
    assert {k: int(d) for k, d in arrivals["deliveries"].items()} == webhook_sent
    assert [o for o, keys in arrivals["occurrences"].items() if len(keys) != 1] == []

    # secondary: the printed table (made before the chat, receipts and escalation parts) says
    # what the rows say
    before_escalation = [t for u, t, o, c, s, *_ in deliveries if c == "webhook" and s == "sent"]
    printed = len(before_escalation) - before_escalation.count("oncall_secondary")
    assert _count(out, "  sent on webhook") == printed
    assert _count(out, "webhook receiver: distinct idempotency keys") == printed
    assert _count(out, "occurrences that arrived under two different keys") == 0
    assert _count(out, "  repeated events (returned the existing request)") == 150
    assert _count(out, "digest: replies buffered (decision 'digested into request N')") == 7
    assert _count(out, f"digest: sent as one message: {summary!r}") == 1
    assert "the secondary's webhook got 2 page(s)" in out
