"""The demo's receipts part: email through (a local stand-in for) SendGrid and SMS through (one
for) Twilio, then the providers' reports back through clarion's real webhooks — an email
delivered and opened, one bounced, an SMS delivered and a STOP reply — and what they leave:
delivery states, receipts, suppressions, and the next notify to each address."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from sqlalchemy import text

from clarion.db.engine import engine
from clarion.ops.table import render
from clarion.standins.fake_sendgrid import EventKey, FakeSendGrid, event, post_events
from clarion.standins.fake_twilio import FakeTwilio

READER, BOUNCER, TEXTER = "reader-ana", "reader-bo", "texter-cy"
ANA_EMAIL, BO_EMAIL, CY_PHONE = "ana@example.com", "bo@bounces.example", "+15555550123"


@dataclass
class Providers:
    sendgrid: FakeSendGrid
    twilio: FakeTwilio
    key: EventKey
    web: str  # clarion web's base URL: the providers' callbacks go there

    def env(self) -> dict[str, str]:
        return {
            "CLARION_SENDGRID_API_KEY": FakeSendGrid.API_KEY,
            "CLARION_SENDGRID_API_URL": self.sendgrid.url,
            "CLARION_SENDGRID_WEBHOOK_PUBLIC_KEY": self.key.public_key,
            "CLARION_EMAIL_FROM": "Clarion demo <notify@clarion.example>",
            "CLARION_TWILIO_ACCOUNT_SID": FakeTwilio.ACCOUNT_SID,
            "CLARION_TWILIO_AUTH_TOKEN": FakeTwilio.AUTH_TOKEN,
            "CLARION_TWILIO_API_URL": self.twilio.url,
            "CLARION_TWILIO_FROM": FakeTwilio.NUMBER,
            "CLARION_PUBLIC_URL": self.web,
        }


@contextmanager
def providers() -> Iterator[Providers]:
    """The stand-ins, and clarion web serving their webhooks on a local port."""
    from clarion.standins.fake_slack import serving
    from clarion.web.app import create_app

    with ExitStack() as stack:
        sendgrid = stack.enter_context(FakeSendGrid())
        twilio = stack.enter_context(FakeTwilio())
        web = stack.enter_context(serving(create_app()))
        yield Providers(sendgrid, twilio, EventKey.generate(), web)


def _deliveries(user: str) -> list[dict]:
    query = text(
        "SELECT id, channel, state, provider_message_id FROM deliveries WHERE user_id = :u "
        "ORDER BY id"
    )
    with engine().connect() as conn:
        return [dict(r) for r in conn.execute(query, {"u": user}).mappings()]


def _wait_sent(users: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(d and d[0]["state"] == "sent" for d in map(_deliveries, users)):
            return True
        time.sleep(0.2)
    return False


def _after(user: str) -> tuple[str, str, str]:
    """(delivery state, receipts, suppression) for a user's first delivery."""
    with engine().connect() as conn:
        state = conn.execute(
            text("SELECT state FROM deliveries WHERE user_id = :u ORDER BY id LIMIT 1"), {"u": user}
        ).scalar()
        receipts = conn.execute(
            text(
                "SELECT string_agg(event || ':' || outcome, ', ' ORDER BY id) FROM receipts "
                "WHERE user_id = :u"
            ),
            {"u": user},
        ).scalar()
        listed = conn.execute(
            text("SELECT string_agg(reason, ', ') FROM suppressions WHERE user_id = :u"),
            {"u": user},
        ).scalar()
    return state or "", receipts or "", listed or ""


def _why_not(user: str, request_id: int) -> str:
    with engine().connect() as conn:
        reasons = conn.execute(
            text(
                "SELECT string_agg(reason, ', ' ORDER BY id) FROM decisions "
                "WHERE user_id = :u AND request_id = :r AND outcome = 'suppress' "
                "AND reason <> 'no_channel'"
            ),
            {"u": user, "r": request_id},
        ).scalar()
        sent = conn.execute(
            text("SELECT count(*) FROM deliveries WHERE user_id = :u AND request_id = :r"),
            {"u": user, "r": request_id},
        ).scalar()
    return f"suppressed: {reasons}" if reasons else ("routed" if sent else "waiting")


def run(p: Providers, say: Callable[[str], None]) -> bool:
    from clarion.tasks import notify, register_recipient

    say("\nreceipts: email through SendGrid and SMS through Twilio (local stand-ins), and back")
    register_recipient(READER, timezone="Europe/Berlin", addresses={"email": ANA_EMAIL})
    register_recipient(BOUNCER, timezone="Europe/Berlin", addresses={"email": BO_EMAIL})
    register_recipient(TEXTER, timezone="America/New_York", addresses={"sms": CY_PHONE})
    for user in (READER, BOUNCER):
        notify(user, "order_shipped", event_id="A-7", variables={"order_number": "A-7"})
    notify(TEXTER, "login_code", event_id="c1", variables={"code": "402913"})
    if not _wait_sent([READER, BOUNCER, TEXTER], 30):
        say("  the messages were not sent in time")
        return False
    say(
        f"  SendGrid took {len(p.sendgrid.sent)} emails, Twilio {len(p.twilio.messages())} SMS; "
        "now the providers report back, signed, to clarion web"
    )
    by_to = {s.to: s for s in p.sendgrid.sent}
    hooks = f"{p.web}/webhooks/sendgrid"
    statuses = [
        post_events(hooks, p.key, [event(by_to[ANA_EMAIL], "delivered")])[0],
        post_events(hooks, p.key, [event(by_to[ANA_EMAIL], "open")])[0],
        post_events(hooks, p.key, [event(by_to[BO_EMAIL], "bounce")])[0],
    ]
    [sms] = p.twilio.messages(CY_PHONE)
    statuses += [status for _, status in p.twilio.progress(sms.sid)]
    stop, _ = p.twilio.inbound(f"{p.web}/webhooks/twilio/inbound", CY_PHONE, "STOP")
    statuses.append(stop)
    forged = post_events(hooks, EventKey.generate(), [event(by_to[ANA_EMAIL], "spamreport")])[0]

    again = {
        BOUNCER: notify(
            BOUNCER, "order_shipped", event_id="A-8", variables={"order_number": "A-8"}
        ),
        TEXTER: notify(TEXTER, "login_code", event_id="c2", variables={"code": "118274"}),
        READER: notify(READER, "order_shipped", event_id="A-8", variables={"order_number": "A-8"}),
    }
    time.sleep(1.0)  # the route tasks run on the workers
    rows = []
    for user, address in ((READER, ANA_EMAIL), (BOUNCER, BO_EMAIL), (TEXTER, CY_PHONE)):
        state, receipts, listed = _after(user)
        rows.append(
            (address, state, receipts, listed or "—", _why_not(user, again[user].request_id))
        )
    say(
        render(
            ["address", "first message", "receipts (event:outcome)", "suppressed", "next notify"],
            rows,
            "  receipts round trip",
        )
    )
    say(f"  a spam report signed with another key: HTTP {forged} (nothing changed)")
    refused = [s for s in statuses if not 200 <= s < 300]
    if refused:
        say(f"  clarion web refused a signed report: HTTP {refused}")
    return (
        not refused
        and forged == 401
        and rows[0][1] == "opened"
        and rows[1][1] == "bounced"
        and rows[1][3] == "bounced"
        and rows[2][3] == "stopped"
        and rows[1][4].startswith("suppressed")
        and rows[2][4].startswith("suppressed")
        and not rows[0][4].startswith("suppressed")
    )
