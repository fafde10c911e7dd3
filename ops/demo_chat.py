"""The demo's chat part: a nudge with buttons sent to (a local stand-in for) Slack, the same nudge as
a Teams Adaptive Card, and clicks through clarion's real /slack/events endpoint."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable

from sqlalchemy import text

from clarion.adapters.teams import to_card
from clarion.catalog.model import EXAMPLES, Catalog
from clarion.db.engine import engine
from clarion.errors import ConfigurationError
from clarion.ops.table import render
from clarion.records import Message
from clarion.standins.fake_slack import FakeSlack, block_actions, signed

SIGNING_SECRET = "demo-signing-secret"
MANAGER, SLACK_ID = "manager-ana", "U0ANA"


def env(fake: FakeSlack) -> dict[str, str]:
    return {
        "CLARION_SLACK_TOKEN": FakeSlack.TOKEN,
        "CLARION_SLACK_API_URL": fake.api_url,
        "CLARION_SLACK_SIGNING_SECRET": SIGNING_SECRET,
    }


def _sent_delivery(timeout: float) -> dict | None:
    deadline = time.monotonic() + timeout
    query = text(
        "SELECT d.id, d.state, r.variables FROM deliveries d JOIN requests r "
        "ON r.user_id = d.user_id AND r.id = d.request_id WHERE d.user_id = :u AND d.channel = 'slack'"
    )
    while time.monotonic() < deadline:
        with engine().connect() as conn:
            row = conn.execute(query, {"u": MANAGER}).mappings().first()
        if row and row["state"] == "sent":
            return dict(row)
        time.sleep(0.2)
    return None


def _click(base: str, value: str, user: str, action: str) -> int:
    body = block_actions(user, value, action_id=f"clarion:{action}")
    headers = signed(SIGNING_SECRET, body, content_type="application/x-www-form-urlencoded")
    request = urllib.request.Request(
        f"{base}/slack/events", data=body, headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def run(fake: FakeSlack, say: Callable[[str], None]) -> bool:
    from clarion.standins.fake_slack import serving
    from clarion.tasks import notify, register_recipient
    from clarion.web.app import create_app

    say("\nchat: a goal prompt with answer buttons, to a manager on Slack")
    register_recipient(MANAGER, timezone="Europe/Berlin", addresses={"slack": SLACK_ID})
    notify(MANAGER, "goal_prompt", event_id="q1-goal", variables={"first_name": "Ana"})
    delivery = _sent_delivery(30)
    posted = fake.posts()[-1] if fake.posts() else None
    if delivery is None or posted is None:
        say("  the nudge was not sent in time")
        return False
    buttons = [e for b in posted.blocks if b.get("type") == "actions" for e in b["elements"]]
    say(f"  Slack got chat.postMessage in DM {posted.channel}: {posted.text!r}")
    say(
        "  buttons: "
        + ", ".join(f"[{b['text']['text']}]" for b in buttons)
        + f"; value of the first: {buttons[0]['value']}"
    )
    say(f"  message metadata: {json.dumps(posted.metadata)}")
    ntype = Catalog.from_yaml(EXAMPLES / "demo.yaml").get("goal_prompt")
    if ntype is None:
        raise ConfigurationError("the demo catalog has no goal_prompt type")
    message = Message(
        delivery["id"],
        MANAGER,
        "goal_prompt",
        "event:q1-goal",
        "teams",
        ntype.render(1, "teams", delivery["variables"]),
        buttons=ntype.templates[1].buttons,
    )
    card = to_card(message)
    say(
        "  the same nudge for Teams, as an Adaptive Card: "
        + ", ".join(f"{a['type']} [{a['title']}]" for a in card.get("actions", []))
        + f" ({len(json.dumps(card))} bytes)"
    )
    ship, quality = (
        next(b["value"] for b in buttons if b["action_id"] == f"clarion:{k}")
        for k in ("ship_faster", "quality")
    )
    with serving(create_app()) as base:
        clicks = [
            ("Ana clicks [Ship faster]", ship, SLACK_ID, "ship_faster"),
            ("Ana clicks [Raise quality] a moment later", quality, SLACK_ID, "quality"),
            (
                "someone else clicks [Grow my team] on Ana's message",
                ship.replace('"ship_faster"', '"grow_team"'),
                "U0MALLORY",
                "grow_team",
            ),
            ("a forged value", '{"u":"manager-ana","d":999999,"a":"quality"}', SLACK_ID, "quality"),
        ]
        statuses = [_click(base, value, user, action) for _, value, user, action in clicks]
    with engine().connect() as conn:
        recorded = conn.execute(text("SELECT outcome, reason FROM interactions ORDER BY id")).all()
        answer = conn.execute(
            text("SELECT state, answer FROM deliveries WHERE id = :id"), {"id": delivery["id"]}
        ).one()
    rows = [
        (what, status, outcome, reason)
        for (what, *_), status, (outcome, reason) in zip(clicks, statuses, recorded, strict=False)
    ]
    say(render(["click", "HTTP", "outcome", "reason"], rows, "  clicks through /slack/events"))
    updated = posted.updates
    last = json.dumps(updated[-1]) if updated else ""
    shown = "Answered: Ship faster" in last
    say(
        f"  delivery {delivery['id']} is {answer[0]} with {answer[1]!r}; the Slack message was updated in "
        f"place {len(updated)} time(s) and shows "
        + ("'Answered: Ship faster'" if shown else "no answer")
    )
    return answer == ("answered", "ship_faster") and shown
