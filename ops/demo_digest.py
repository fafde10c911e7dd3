"""The demo's digest part: seven replies from three sellers to one buyer are buffered (each one's
decision says which digest request carries it), and when the 6 s window closes the beat tick finds
the digest request, which goes through the router and arrives as one message:
"3 sellers replied to you (7 new messages)"."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import text

from clarion.db.engine import engine

BUYER = "buyer-dee"
REPLIES = [
    ("ann", "bike"),
    ("bob", "sofa"),
    ("ann", "bike"),
    ("cat", "lamp"),
    ("bob", "sofa"),
    ("ann", "bike"),
    ("cat", "lamp"),
]
_DIGEST = text(
    "SELECT r.id, r.state, r.variables->>'summary', "
    "(SELECT count(*) FROM deliveries d WHERE d.user_id = r.user_id AND d.request_id = r.id "
    " AND d.state = 'sent') FROM requests r "
    "WHERE r.user_id = :u AND r.type_key = 'replies_digest' ORDER BY r.id"
)
_BUFFERED = text(
    "SELECT count(*) FROM decisions WHERE user_id = :u AND gate = 'digest' "
    "AND detail LIKE 'digested into request %'"
)


def send(say: Callable[[str], None]) -> None:
    """Register the buyer and notify the replies (the window opens with the first)."""
    from clarion.tasks import notify_many, register_recipient

    register_recipient(BUYER, timezone="Europe/Berlin")
    notify_many(
        [
            dict(
                user_id=BUYER,
                type_key="seller_replied",
                event_id=f"reply-{n}",
                variables={"seller": seller, "listing": listing},
            )
            for n, (seller, listing) in enumerate(REPLIES)
        ]
    )
    say(f"digest: {len(REPLIES)} seller replies to {BUYER}, buffered into a 6 s window")


def wait(url: str, say: Callable[[str], None], timeout: float = 30) -> bool:
    """Until the digest is sent; says what it carried and what `explain` shows for an item."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine(url).connect() as conn:
            digests = conn.execute(_DIGEST, {"u": BUYER}).all()
        if digests and all(sent for *_, sent in digests):
            for id_, _, summary, _ in digests:
                say(f"digest: request {id_} sent to {BUYER}: {summary!r}")
            return True
        time.sleep(0.25)
    say(f"digest: not sent within {timeout:g} s")
    return False


def rows(url: str) -> list[tuple[str, int]]:
    """The demo table's digest rows."""
    with engine(url).connect() as conn:
        digests = conn.execute(_DIGEST, {"u": BUYER}).all()
        buffered = conn.execute(_BUFFERED, {"u": BUYER}).scalar_one()
    return [
        ("digest: replies buffered (decision 'digested into request N')", buffered),
        *((f"digest: sent as one message: {summary!r}", sent) for _, _, summary, sent in digests),
    ]
