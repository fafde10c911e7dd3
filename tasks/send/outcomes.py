"""Settling a send's outcome on its row: failed (retry or fail), unknown (reconcile, resend under
the idempotency key, or hold), and the incidents that mark a possible repeat.

The unknown-outcome policy is one pure function, `unknown_action`:

| channel can                     | at_most_once (activation, marketing, digest) | at_least_once (transactional, security, alert) |
| ------------------------------- | -------------------------------------------- | ---------------------------------------------- |
| look for its message (Slack, SMS) | reconcile, then send only if conclusively not found | the same                                |
| dedup by key (webhook)          | resend under the same key                    | the same                                       |
| replace on the device (push)    | resend under the same collapse id + incident | the same                                       |
| neither (Teams, email)          | hold as `unknown` + incident                 | resend + `possible_duplicate` incident         |

A reconcile that cannot tell (the provider's look-up is inconclusive) falls to the rows below it.
Whatever the row, a provider's own report naming the delivery (an SMS status callback, a
SendGrid event) settles the outcome as sent when it arrives (db.receipts), held or not; a resend
waits the adapter's `evidence_wait` for such a report first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from clarion import clock, metrics
from clarion.adapters.base import Adapter
from clarion.db import claims, escalations, ledger
from clarion.errors import PermanentSendError, SendError
from clarion.rows import ClaimedDelivery
from clarion.tasks import runtime
from clarion.tasks.send.connection import RowConnection
from clarion.tasks.send.retry import RetryPolicy, decide

log = logging.getLogger(__name__)


def unknown_action(adapter: Adapter, guarantee: str, *, checkable: bool = True) -> str:
    """What a send whose outcome is unknown may do next: reconcile | resend | hold.
    checkable=False: the provider was asked already, or cannot be."""
    if checkable and hasattr(adapter, "reconcile"):
        return "reconcile"  # the next attempt looks for the message first
    if getattr(adapter, "dedups_by_key", False) or guarantee == "at_least_once":
        return "resend"
    if getattr(adapter, "replaces_on_device", False):  # the same collapse id: replaced, not added
        return "resend"
    return "hold"


def guarantee_of(row: ClaimedDelivery) -> str:
    ntype = runtime.catalog().get(row.type_key)
    return ntype.guarantee if ntype is not None else "at_most_once"


def settle_unknown(
    db: RowConnection,
    row: ClaimedDelivery,
    token: str,
    error: SendError,
    adapter: Adapter,
    policy: RetryPolicy,
    *,
    checkable: bool = True,
    release: bool = True,
    counted: bool = False,
) -> bool:
    """Settle an unknown outcome; True if the row is now held as `unknown`. Otherwise, with
    release=True, the claim goes back marked "may have sent" (or fails at the attempt cap);
    with release=False the caller goes on to send in this attempt. counted=True: the outcome is
    an earlier attempt's, already in clarion_sends_total (its answer was lost and settled)."""
    action = unknown_action(adapter, guarantee_of(row), checkable=checkable)
    log.warning(
        "send outcome unknown: %s",
        error,
        extra={"action": "send_unknown", "delivery": row.key, "next": action},
    )
    if not counted:
        metrics.SENDS.labels(row.lane, row.channel, "unknown").inc()
    if action == "hold":
        _hold(db, row, token, error)
        return True
    if release:
        wait = float(getattr(adapter, "evidence_wait", 0.0))
        _retry_or_fail(db, row, token, error, policy, maybe_sent=True, wait=wait)
    return False


def _hold(db: RowConnection, row: ClaimedDelivery, token: str, error: SendError) -> None:
    """Hold the row as `unknown` for an operator, with its decision and incident."""
    now = clock.now()
    if not db.run(
        lambda c: claims.hold_unknown(c, row.key, token=token, error=str(error)[:500], now=now)
    ):
        return
    with db.begin() as tx:
        _decide(tx, row, "unknown", error.reason, str(error), now)
        metrics.INCIDENTS.labels("outcome_unknown").inc()
        ledger.record_incident(
            tx,
            row.key,
            kind="outcome_unknown",
            now=now,
            detail=(
                f"{error}; the provider can neither be asked nor dedup, and the type is at-most-once: "
                "held for an operator (clarion redrive --state unknown sends it again)"
            )[:1000],
        )


def settle_failure(
    db: RowConnection, row: ClaimedDelivery, token: str, error: SendError, policy: RetryPolicy
) -> None:
    """The provider did not take the message (or nothing was attempted): retry later or fail."""
    _retry_or_fail(db, row, token, error, policy, maybe_sent=False)


def _retry_or_fail(
    db: RowConnection,
    row: ClaimedDelivery,
    token: str,
    error: SendError,
    policy: RetryPolicy,
    *,
    maybe_sent: bool,
    wait: float = 0.0,
) -> None:
    """Retry no sooner than `wait` seconds from now (an unknown outcome's wait for the provider's
    report, which settles it as sent: db.receipts), or fail at the cap."""
    now = clock.now()
    retry = decide(error, row.attempts, policy)
    if retry is not None:
        if not maybe_sent:  # an unknown outcome was counted as one already
            outcome = "deferred" if retry.refund else "retry"
            metrics.SENDS.labels(row.lane, row.channel, outcome).inc()
        db.run(
            lambda c: claims.release_claim(
                c,
                row.key,
                token=token,
                error=str(error)[:500],
                now=now,
                refund_attempt=retry.refund,
                maybe_sent=maybe_sent,
                not_before=now + timedelta(seconds=max(retry.delay, wait)),
            )
        )
        return
    _fail(db, row, token, error, maybe_sent=maybe_sent, now=now)


def _fail(
    db: RowConnection,
    row: ClaimedDelivery,
    token: str,
    error: SendError,
    *,
    maybe_sent: bool,
    now: datetime,
) -> None:
    """Fail the row for good and record why, in one transaction (the claim must still be ours)."""
    with db.begin() as tx:
        if claims.fail_delivery(tx, row.key, token=token, error=str(error)[:500], now=now) is None:
            return
        reason = error.reason if isinstance(error, PermanentSendError) else "retries_exhausted"
        metrics.SENDS.labels(row.lane, row.channel, "failed").inc()
        earlier = maybe_sent or row.maybe_sent_at is not None
        _decide(
            tx,
            row,
            "failed",
            reason,
            f"{error}" + ("; an attempt may have reached the provider" if earlier else ""),
            now,
        )
        escalations.delivery_event(
            tx, row.user_id, row.id, "failed", f"{row.channel}: {error}", now
        )


def _decide(
    conn: Connection, row: ClaimedDelivery, outcome: str, reason: str, detail: str, now: datetime
) -> None:
    ledger.insert_decisions(
        conn,
        [
            ledger.Decision(
                row.user_id,
                row.request_id,
                "deliver",
                outcome,
                reason,
                detail[:500],
                row.channel,
                row.id,
            )
        ],
        now=now,
    )


def record_incident(db: RowConnection, row: ClaimedDelivery, kind: str, detail: str) -> None:
    """Something an operator must look at: a repeat that happened or may have."""
    db.run(lambda c: ledger.record_incident(c, row.key, kind=kind, detail=detail, now=clock.now()))
    metrics.INCIDENTS.labels(kind).inc()
    log.warning("incident: %s", kind, extra={"action": kind, "delivery": row.key})


def record_exhausted(conn: Connection, rows: Sequence[dict[str, Any]], *, now: datetime) -> None:
    """Decisions for rows failed at the claim because their attempts were used up."""
    for r in rows:
        metrics.SENDS.labels(r["lane"], r["channel"], "failed").inc()
        escalations.delivery_event(
            conn, r["user_id"], r["id"], "failed", f"{r['channel']}: retries_exhausted", now
        )
    ledger.insert_decisions(
        conn,
        [
            ledger.Decision(
                r["user_id"],
                r["request_id"],
                "deliver",
                "failed",
                "retries_exhausted",
                (
                    f"{r['attempts']} attempts used"
                    + ("; an attempt may have reached the provider" if r["maybe_sent_at"] else "")
                    + (f"; last error: {r['last_error']}" if r["last_error"] else "")
                )[:500],
                r["channel"],
                r["id"],
            )
            for r in rows
        ],
        now=now,
    )
