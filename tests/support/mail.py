"""The email tests' world, shared by tests/integration/test_email.py (SMTP) and
test_email_sendgrid.py: the email catalog and identities, the settings that select them, and the
steps (notify + route, retry) with what they leave in the ledger."""

from __future__ import annotations

from sqlalchemy import text

from clarion.db.engine import engine
from clarion.tasks import notify
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.environment import ROOT
from tests.support.pipeline import drain, rows

CATALOG = ROOT / "tests" / "catalog_email.yaml"


TX = "Clarion <notify@tx.clarion.test>"


MK = "Clarion News <news@mk.clarion.test>"


PUBLIC = "https://clarion.example"


Key = tuple[str, int]


def email_settings(**more: object) -> dict[str, object]:
    return {
        "catalog": CATALOG,
        "email_from": TX,
        "email_from_marketing": MK,
        "public_url": PUBLIC,
        "email_timeout": 1,
        "send_timeout": 4,
        **more,
    }


def notify_and_route(user: str, type_key: str, event: str = "e1", **variables: str) -> Key | None:
    """Notify and route one request; the key of its email delivery, or None if it got none."""
    request = notify(user, type_key, event_id=event, variables=variables or None)
    assert route([user], [request.request_id]) == 1
    drain("transactional"), drain("activation")
    found = rows(
        "SELECT user_id, id FROM deliveries WHERE request_id = :r AND channel = 'email'",
        r=request.request_id,
    )
    return (found[0]["user_id"], found[0]["id"]) if found else None


def send(user: str, type_key: str, event: str = "e1", **variables: str) -> tuple[Key, int]:
    """Notify and route one request: the route sends its email itself, in-process. The key and
    the sends recorded (1 if the row is sent, else 0); nothing is left for a deliver task."""
    key = notify_and_route(user, type_key, event, **variables)
    assert key is not None
    assert deliver([key[0]], [key[1]]) == 0  # the route's own claim: no second claim, no resend
    return key, int(delivery(key)["state"] == "sent")


def retry(key: Key) -> int:
    """The next attempt, once it is due (the backoff is not what is tested here)."""
    with engine().begin() as conn:
        conn.execute(text("UPDATE deliveries SET not_before = now() WHERE state = 'pending'"))
    return deliver([key[0]], [key[1]])


def delivery(key: Key) -> dict:
    [row] = rows(
        "SELECT state, attempts, platform, provider_message_id, last_error, maybe_sent_at"
        " FROM deliveries WHERE user_id = :u AND id = :i",
        u=key[0],
        i=key[1],
    )
    return row


def incidents() -> list[str]:
    return [r["kind"] for r in rows("SELECT kind FROM incidents ORDER BY id")]


def decisions(user: str) -> list[dict]:
    return rows(
        "SELECT gate, outcome, reason, channel FROM decisions WHERE user_id = :u ORDER BY id",
        u=user,
    )
