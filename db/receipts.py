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

A provider's own report (`Receipt.platform` set: a Twilio status callback, a SendGrid event) that
names a delivery whose send had an unknown outcome proves the provider took it: the row is
settled as sent (`settle_unknown`) before the report is applied, whether it was held `unknown`
or released to be resent (a resend not yet begun is then not made). A report that comes while
the row is still claimed is `early`: the next attempt reads it first (`evidence`), and
`replay_early` settles a row held meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from clarion.db import escalations, gating, ledger
from clarion.db.schema import SENDING_STATES
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
_SENDING = ", ".join(f"'{state}'" for state in SENDING_STATES)
_SETTLE_UNKNOWN = text(
    f"""
    UPDATE deliveries d
    SET state = 'sent', platform = :platform,
        provider_message_id = coalesce(:mid, d.provider_message_id),
        sent_at = coalesce(d.maybe_sent_at, :now), claim_token = NULL, lease_until = NULL,
        due_at = NULL, last_error = NULL, updated_at = :now, send_started_at = NULL,
        maybe_sent_at = NULL
    WHERE d.user_id = :u AND d.id = :id
      AND (d.state = 'unknown' OR (d.state = 'pending' AND d.maybe_sent_at IS NOT NULL))
      AND NOT EXISTS (
        SELECT 1 FROM deliveries o
        WHERE o.user_id = d.user_id AND o.type_key = d.type_key
          AND o.occurrence_key = d.occurrence_key AND o.id <> d.id AND o.state IN ({_SENDING})
          AND (o.channel = d.channel OR (o.one_platform AND d.one_platform))
      )
    RETURNING d.request_id
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
                          event_id, detail, outcome, occurred_at, received_at, platform)
    VALUES (:u, :d, :channel, :event, :mid, :address, :event_id, :detail, :outcome, :at, :now,
            :platform)
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
    if found.state not in SENT and not settle_unknown(conn, found, receipt, now):
        return "early"  # the send is not recorded yet (it is still claimed): later
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


def settle_unknown(conn: Connection, found: Found, receipt: Receipt, now: datetime) -> bool:
    """Settle as sent a delivery whose send had an unknown outcome, on the provider's own report
    naming it (by clarion's delivery id: a held row has no provider message id to be found by).
    False: not such a report, or the row is not owed a settlement (still claimed: its attempt
    is in flight; already settled; failed), or another row of its occurrence holds the send."""
    if receipt.platform is None or receipt.delivery_id is None:
        return False
    settled = conn.execute(
        _SETTLE_UNKNOWN,
        {
            "u": found.user_id,
            "id": found.id,
            "platform": receipt.platform,
            "mid": receipt.provider_message_id,
            "now": now,
        },
    ).first()
    if settled is None:
        return False
    detail = f"{receipt.platform} reported {receipt.event} for it: {receipt.detail}"
    ledger.insert_decisions(
        conn,
        [
            ledger.Decision(
                found.user_id,
                settled[0],
                "deliver",
                "sent",
                "settled_by_receipt",
                detail[:500],
                found.channel,
                found.id,
            )
        ],
        now=now,
    )
    return True


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
            "platform": receipt.platform,
        },
    )


@dataclass(frozen=True)
class Evidence:
    """A provider's own report naming a delivery, kept `early` (or `stale`): it came while the
    delivery's send was still in flight, so the send reached the provider."""

    platform: str
    provider_message_id: str | None
    event: str


_EVIDENCE = text(
    """
    SELECT platform, provider_message_id, event FROM receipts
    WHERE user_id = :u AND delivery_id = :id AND platform IS NOT NULL
      AND outcome IN ('early', 'stale')
    ORDER BY id DESC LIMIT 1
    """
)


def evidence(conn: Connection, key: tuple[str, int]) -> Evidence | None:
    """The provider's report that it took this delivery's message, if one came before the send's
    outcome was recorded (what an attempt after an unknown outcome reads first)."""
    row = conn.execute(_EVIDENCE, {"u": key[0], "id": key[1]}).first()
    return None if row is None else Evidence(row[0], row[1], row[2])


_EARLY = text(
    """
    SELECT e.user_id, e.id, e.delivery_id, e.channel, e.event, e.provider_message_id, e.address,
           e.event_id, e.detail, e.occurred_at, e.received_at, e.platform
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
            platform=row[11],
        )
        found, _ = _find(conn, receipt)
        if found is None:
            continue
        outcome = _apply(conn, found, receipt, now, category_of)  # may settle a held unknown
        if outcome == "early":
            if now - row[10] > EARLY_FOR:
                conn.execute(_SETTLE, {"outcome": "stale", "u": user_id, "id": rid})
            continue
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
