"""The demo's escalation part (Gridwatch): three pages on Slack, each with the chain Slack → no
ack in 3 s → SMS (the local Twilio) → no ack in 10 s → the secondary's webhook (the local
receiver), run by the real workers and beat:

- one acknowledged at once through clarion's real /slack/events: nothing more is sent;
- one nobody acknowledges: the SMS after 3 s, the secondary 10 s after that;
- one whose SMS number is dead: Twilio's signed `undelivered` callback escalates to the secondary
  at once, without waiting out the timer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sqlalchemy import text

from clarion.db.engine import engine
from clarion.ops import demo_chat
from clarion.ops.demo_receipts import Providers
from clarion.ops.table import render
from clarion.standins.receiver import Receiver

SECONDARY = "oncall-sam"
PAGES = (  # (user, Slack id, phone, what happens)
    ("oncall-ana", "U0ONCALLANA", "+15555550111", "acknowledged on Slack at once"),
    ("oncall-bo", "U0ONCALLBO", "+15555550112", "nobody acknowledges"),
    ("oncall-cy", "U0ONCALLCY", "+15555550113", "the SMS number is dead"),
)
DEAD = PAGES[2][2]


def _chain(user: str) -> dict | None:
    with engine().connect() as conn:
        row = (
            conn.execute(
                text(
                    "SELECT e.state, e.next_step, e.request_id, d.id AS delivery, d.state AS slack "
                    "FROM escalations e JOIN deliveries d ON d.user_id = e.user_id "
                    "AND d.request_id = e.request_id WHERE e.user_id = :u"
                ),
                {"u": user},
            )
            .mappings()
            .first()
        )
    return dict(row) if row else None


def _steps(user: str) -> list[tuple[str, str, float]]:
    """(outcome/reason, detail, seconds after the page) of the chain's decisions."""
    with engine().connect() as conn:
        rows = conn.execute(
            text(
                "SELECT d.outcome || '/' || d.reason, d.detail, "
                "extract(epoch FROM d.decided_at - q.created_at) "
                "FROM decisions d JOIN requests q ON q.user_id = d.user_id AND q.id = d.request_id "
                "JOIN escalations e ON e.user_id = q.user_id AND e.request_id = q.id "
                "WHERE d.user_id = :u AND d.gate = 'escalation' ORDER BY d.id"
            ),
            {"u": user},
        ).all()
    return [(r[0], r[1], float(r[2])) for r in rows]


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def run(p: Providers, receiver: Receiver, say: Callable[[str], None]) -> bool:
    from clarion.tasks import notify, register_recipient

    say("\nescalation: page on Slack → no ack in 3 s → SMS → no ack in 10 s → the secondary")
    register_recipient(
        SECONDARY, timezone="UTC", addresses={"webhook": "https://oncall.example/sam"}
    )
    p.twilio.fail_number(DEAD, 30003)
    hooks_before = receiver.arrivals.total
    for user, slack_id, phone, _ in PAGES:
        register_recipient(user, timezone="UTC", addresses={"slack": slack_id, "sms": phone})
        notify(
            user,
            "oncall_page",
            event_id="db-1-down",
            variables={"host": "db-1", "secondary": SECONDARY},
        )
    if not _wait(lambda: all((c := _chain(u)) and c["slack"] == "sent" for u, *_ in PAGES), 20):
        say("  the pages were not sent in time")
        return False
    ana = _chain(PAGES[0][0])
    assert ana is not None
    value = json.dumps({"u": PAGES[0][0], "d": ana["delivery"], "a": "ack"}, separators=(",", ":"))
    clicked = demo_chat._click(p.web, value, PAGES[0][1], "ack")
    say(f"  {PAGES[0][0]} clicks [Acknowledge]: HTTP {clicked}")
    if not _wait(lambda: bool(p.twilio.messages(DEAD)), 20):
        say("  the SMS steps were not sent in time")
        return False
    [dead] = p.twilio.messages(DEAD)
    statuses = [status for _, status in p.twilio.progress(dead.sid)]  # queued, sent, undelivered
    finished = _wait(
        lambda: (
            all((c := _chain(u)) and c["state"] in ("acked", "finished") for u, *_ in PAGES)
            and receiver.arrivals.total - hooks_before >= 2
        ),
        40,
    )
    time.sleep(1.0)  # one more tick: nothing further may fire
    rows = []
    for user, _, phone, what in PAGES:
        chain = _chain(user) or {}
        steps = "; ".join(
            f"{reason} +{at:.0f}s"
            for reason, _, at in _steps(user)
            if not reason.startswith("wait")
        )
        rows.append((user, what, len(p.twilio.messages(phone)), chain.get("state", "?"), steps))
    secondary = receiver.arrivals.total - hooks_before
    say(
        render(
            ["page", "scenario", "SMS", "chain", "escalation decisions (seconds after the page)"],
            rows,
            "  escalation chains",
        )
    )
    say(f"  the secondary's webhook got {secondary} page(s); Twilio callbacks: HTTP {statuses}")
    return (
        finished
        and clicked == 200
        and [r[2] for r in rows] == [0, 1, 1]
        and [r[3] for r in rows] == ["acked", "finished", "finished"]
        and secondary == 2
        and "hurry/step_failed" in rows[2][4]
    )
