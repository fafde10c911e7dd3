"""Receipts move a sent delivery through its states, one conditional update each.

    sent → delivered → opened / read → clicked            (progress: never backwards)
    sent | delivered → bounced | undelivered              (the provider gave up: final)

A receipt applies only if the row is in a state it may leave (`FROM`), so a receipt that arrives
twice, or after a later one (opened before delivered), changes nothing it should not: its outcome
is `repeated` or `stale`. Every receipt is kept in `receipts`, applied or not; one for a message
id clarion never sent is kept as `unknown_message` (user_id '') and ignored. One that arrives
before the send is recorded (a fast callback) is `early`; `replay_early` applies it later.

Hard bounces, complaints and invalid push tokens go on the permanent suppression list (with the
reason, per address and channel); an unsubscribe turns the type's category off for the channel
(a preference, so transactional mail still reaches the address); STOP/START/HELP steer SMS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from clarion.db import escalations, gating
from clarion.records import Keyword, Receipt

# event → (state it moves to, states it may leave); None: recorded, no state change
MOVES: dict[str, tuple[str, tuple[str, ...]] | None] = {
    "accepted": None,
    "delivered": ("delivered", ("sent",)),
    "opened": ("opened", ("sent", "delivered")),
    "read": ("read", ("sent", "delivered", "opened")),
    "clicked": ("clicked", ("sent", "delivered", "opened", "read")),
    "bounced": ("bounced", ("sent", "delivered")),
    "soft_bounced": None,
    "complained": None,
    "unsubscribed": None,
    "failed": ("undelivered", ("sent", "delivered")),
    "invalid_token": ("undelivered", ("sent", "delivered")),
}
# event → suppression reason (the address is never used again on that channel)
SUPPRESS = {"bounced": "bounced", "complained": "complained", "invalid_token": "invalid_token"}
SENT = ("sent", "delivered", "opened", "read", "clicked", "answered", "bounced", "undelivered")
CategoryOf = Callable[[str], str | None]
EARLY_FOR = timedelta(hours=1)  # an early receipt whose send is never recorded is given up


@dataclass(frozen=True)
class Found:
    user_id: str
    id: int
    state: str
    channel: str
    type_key: str
    address: str | None
    requested_at: datetime


_BY_ID = text(
    """
    SELECT d.user_id, d.id, d.state, d.channel, d.type_key, r.addresses ->> d.channel, q.created_at
    FROM deliveries d JOIN recipients r ON r.user_id = d.user_id
    JOIN requests q ON q.user_id = d.user_id AND q.id = d.request_id
    WHERE d.user_id = :u AND d.id = :id FOR UPDATE OF d
    """
)
_BY_MESSAGE = text(
    """
    SELECT d.user_id, d.id, d.state, d.channel, d.type_key, r.addresses ->> d.channel, q.created_at
    FROM deliveries d JOIN recipients r ON r.user_id = d.user_id
    JOIN requests q ON q.user_id = d.user_id AND q.id = d.request_id
    WHERE d.provider_message_id = :mid AND d.channel = :channel
    ORDER BY d.id LIMIT 1 FOR UPDATE OF d
    """
)
_MOVE = text(
    """
    UPDATE deliveries SET state = :state, updated_at = :now,
        last_error = CASE WHEN :error = '' THEN last_error ELSE :error END
    WHERE user_id = :u AND id = :id AND state = ANY(CAST(:from AS text[]))
    """
)
_RECORD = text(
    """
    INSERT INTO receipts (user_id, delivery_id, channel, event, provider_message_id, address,
                          event_id, detail, outcome, occurred_at, received_at)
    VALUES (:u, :d, :channel, :event, :mid, :address, :event_id, :detail, :outcome, :at, :now)
    """
)
_SEEN = text(
    """
    SELECT 1 FROM receipts WHERE user_id = :u AND delivery_id = :d AND event = :event
        AND outcome IN ('applied', 'repeated', 'stale') LIMIT 1
    """
)


def _find(conn: Connection, receipt: Receipt) -> tuple[Found | None, str | None]:
    """The delivery a receipt is about, or (None, why not)."""
    row = None
    if receipt.user_id is not None and receipt.delivery_id is not None:
        row = conn.execute(_BY_ID, {"u": receipt.user_id, "id": receipt.delivery_id}).first()
    elif receipt.provider_message_id:
        row = conn.execute(
            _BY_MESSAGE, {"mid": receipt.provider_message_id, "channel": receipt.channel}
        ).first()
    if row is None:
        return None, "unknown_message"
    found = Found(*row)
    if found.channel != receipt.channel:
        return None, "mismatch"
    return found, None


def apply_receipt(
    conn: Connection,
    receipt: Receipt,
    *,
    now: datetime,
    category_of: CategoryOf | None = None,
    on_delivered: Callable[[str, datetime], None] | None = None,
) -> str:
    """Apply one receipt in the caller's transaction; its outcome (see RECEIPT_OUTCOMES).
    `category_of(type_key)` names the type's category, so an unsubscribe turns off the category;
    `on_delivered(channel, requested_at)` hears of each delivery a receipt moved to delivered."""
    found, why = _find(conn, receipt)
    if found is None:
        _record(conn, receipt, "", None, why or "unknown_message", now)
        return why or "unknown_message"
    outcome = _apply(conn, found, receipt, now, category_of)
    _record(conn, receipt, found.user_id, found.id, outcome, now)
    if on_delivered and outcome == "applied" and receipt.event == "delivered":
        on_delivered(found.channel, found.requested_at)
    return outcome


def _apply(
    conn: Connection,
    found: Found,
    receipt: Receipt,
    now: datetime,
    category_of: CategoryOf | None = None,
) -> str:
    if found.state not in SENT:
        return "early"  # the send is not recorded yet (or was held as unknown): later
    move = MOVES[receipt.event]
    changed = False
    if move is not None:
        state, leaves = move
        error = f"{receipt.event}: {receipt.detail}"[:300] if state == "undelivered" else ""
        if state == "bounced":
            error = f"bounced: {receipt.detail}"[:300]
        changed = (
            conn.execute(
                _MOVE,
                {
                    "u": found.user_id,
                    "id": found.id,
                    "state": state,
                    "from": list(leaves),
                    "now": now,
                    "error": error,
                },
            ).rowcount
            == 1
        )
    seen = (
        conn.execute(_SEEN, {"u": found.user_id, "d": found.id, "event": receipt.event}).first()
        is not None
    )
    _consequences(conn, found, receipt, now, first=not seen, category_of=category_of)
    if changed:
        escalations.delivery_event(
            conn, found.user_id, found.id, receipt.event, receipt.detail, now
        )
        return "applied"
    if seen:
        return "repeated"
    return "stale" if move is not None else "applied"


def _consequences(
    conn: Connection,
    found: Found,
    receipt: Receipt,
    now: datetime,
    *,
    first: bool,
    category_of: CategoryOf | None,
) -> None:
    """What a receipt means beyond the row: the suppression list, preferences."""
    address = receipt.address or found.address or ""
    if receipt.event in SUPPRESS and address:
        for value in address.split() if found.channel == "push" else [address]:
            if receipt.event == "invalid_token" and receipt.address and value != receipt.address:
                continue
            gating.suppress_address(
                conn,
                found.user_id,
                channel=found.channel,
                address=value,
                reason=SUPPRESS[receipt.event],
                detail=f"{receipt.event}: {receipt.detail}"[:500],
                now=now,
            )
            if found.channel == "push":
                gating.forget_address(conn, found.user_id, channel="push", value=value, now=now)
    if receipt.event == "unsubscribed" and first:
        category = category_of(found.type_key) if category_of else None
        gating.set_preferences(
            conn,
            found.user_id,
            [("category", category, found.channel, False)]
            if category
            else [("type", found.type_key, found.channel, False)],
            now=now,
        )


def _record(
    conn: Connection,
    receipt: Receipt,
    user_id: str,
    delivery_id: int | None,
    outcome: str,
    now: datetime,
) -> None:
    conn.execute(
        _RECORD,
        {
            "u": user_id,
            "d": delivery_id,
            "channel": receipt.channel,
            "event": receipt.event,
            "mid": receipt.provider_message_id,
            "address": receipt.address,
            "event_id": receipt.event_id,
            "detail": receipt.detail[:500],
            "outcome": outcome,
            "at": receipt.occurred_at,
            "now": now,
        },
    )


_EARLY = text(
    """
    SELECT e.user_id, e.id, e.delivery_id, e.channel, e.event, e.provider_message_id, e.address,
           e.event_id, e.detail, e.occurred_at, e.received_at
    FROM receipts e
    WHERE e.outcome = 'early'
    ORDER BY e.received_at LIMIT :limit FOR UPDATE SKIP LOCKED
    """
)
_SETTLE = text("UPDATE receipts SET outcome = :outcome WHERE user_id = :u AND id = :id")


def replay_early(
    conn: Connection, *, now: datetime, limit: int = 500, category_of: CategoryOf | None = None
) -> int:
    """Apply receipts that arrived before their send was recorded; the number applied. One whose
    send is still not recorded after EARLY_FOR becomes `stale`."""
    applied = 0
    for row in conn.execute(_EARLY, {"limit": limit}).all():
        user_id, rid = row[0], row[1]
        receipt = Receipt(
            channel=row[3],
            event=row[4],
            provider_message_id=row[5],
            occurred_at=row[9],
            address=row[6],
            event_id=row[7],
            detail=row[8],
            user_id=user_id,
            delivery_id=row[2],
        )
        found, _ = _find(conn, receipt)
        if found is None:
            continue
        if found.state not in SENT:
            if now - row[10] > EARLY_FOR:
                conn.execute(_SETTLE, {"outcome": "stale", "u": user_id, "id": rid})
            continue
        outcome = _apply(conn, found, receipt, now, category_of)
        conn.execute(_SETTLE, {"outcome": outcome, "u": user_id, "id": rid})
        applied += outcome == "applied"
    return applied


# --- inbound keywords -------------------------------------------------------------------------------

_BY_NUMBER = text(
    "SELECT user_id FROM recipients WHERE addresses ? 'sms' AND addresses ->> 'sms' = :number"
)
_UNSTOP = text(
    """
    DELETE FROM suppressions
    WHERE user_id = :u AND channel = :channel AND address = :address AND reason = 'stopped'
    """
)


def apply_keyword(conn: Connection, keyword: Keyword, *, now: datetime) -> list[str]:
    """STOP suppresses the number for every recipient who has it; START lifts a STOP (and only a
    STOP: a number that bounced stays suppressed); HELP changes nothing. The users touched."""
    users = [r[0] for r in conn.execute(_BY_NUMBER, {"number": keyword.address})]
    for user_id in users:
        if keyword.keyword == "stop":
            gating.suppress_address(
                conn,
                user_id,
                channel=keyword.channel,
                address=keyword.address,
                reason="stopped",
                detail=f"replied {keyword.detail or 'STOP'}"[:500],
                now=now,
            )
        elif keyword.keyword == "start":
            conn.execute(
                _UNSTOP, {"u": user_id, "channel": keyword.channel, "address": keyword.address}
            )
    return users
