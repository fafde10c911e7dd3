"""The deliver task: claim, render, send, and record "sent" only after the send."""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from celery import shared_task
from sqlalchemy import Connection

from adapters.base import Message
from clarion import clock, faults, settings
from clarion.errors import PermanentSendError, SendError, TransientSendError
from db import ledger
from db.engine import autocommit, engine
from tasks import runtime
from tasks.retry import RetryPolicy, decide

log = logging.getLogger(__name__)
UNRECONCILED = "unreconciled"  # last_error prefix: a takeover whose earlier send is not yet ruled out


@shared_task(name="clarion.deliver")
def deliver(users: list[str], ids: list[int]) -> int:
    """Deliver a batch. Rows another worker holds, or that are done, are skipped by the claim."""
    s = settings.get()
    token = str(uuid.uuid4())
    now = clock.now()
    lease_until = now + timedelta(seconds=s.claim_lease)
    with engine().begin() as conn:
        claimed = ledger.claim_deliveries(conn, zip(users, ids, strict=True), token=token, now=now,
                                          lease_until=lease_until)
    runtime.count("deliver_skipped_not_claimable", len(ids) - len(claimed))
    _record_takeovers(claimed, now)
    faults.hit("deliver.after_claim")
    policy = RetryPolicy(max_attempts=s.max_attempts)
    # Never start a send that could still be running when the lease lapses and another worker
    # may take the row over: rows reached too late are handed back unsent instead.
    last_start = lease_until - timedelta(seconds=min(s.claim_lease / 2, s.webhook_timeout + 1))
    lanes = max(1, min(s.send_concurrency, len(claimed)))

    def run(share: list[dict[str, Any]]) -> int:
        # one auto-committing connection per sending thread: "sent" is durable once PostgreSQL answers
        with autocommit().connect() as conn:
            return sum(_deliver_one(conn, row, token, policy, last_start) for row in share)

    if lanes == 1:
        return run(claimed)
    # Sends wait on providers; a few threads overlap those waits.
    with ThreadPoolExecutor(max_workers=lanes) as pool:
        return sum(pool.map(run, [claimed[i::lanes] for i in range(lanes)]))


def _record_takeovers(claimed: list[dict[str, Any]], now) -> None:
    """A claim taken from a lapsed lease: its previous holder may have sent. Recorded at once, so
    the record survives whatever happens to this attempt."""
    taken = [row for row in claimed if row["taken_over"]]
    if not taken:
        return
    with engine().begin() as conn:
        for row in taken:
            ledger.record_incident(conn, (row["user_id"], row["id"]), kind="claim_taken_over", now=now,
                                   detail=f"lease lapsed on attempt {row['attempts'] - 1}; that attempt "
                                          "may have sent (receivers dedup on the idempotency key)")


def _deliver_one(conn: Connection, row: dict[str, Any], token: str, policy: RetryPolicy, last_start) -> int:
    key = (row["user_id"], row["id"])
    if clock.now() > last_start:
        now = clock.now()
        error = "batch ran out of lease time"
        with engine().begin() as tx:
            ledger.release_claim(tx, key, token=token, not_before=now, now=now, refund_attempt=True,
                                 error=f"{UNRECONCILED}: {error}" if _owes_reconcile(row) else error)
        log.info("released an unsent claim", extra={"action": "claim_released", "delivery": key})
        return 0
    try:
        message = _render(row)
        adapter = runtime.adapters()[row["channel"]]
        # A claim taken over from a lapsed lease: a channel that can look for its own earlier
        # message (Slack's message metadata) finds it instead of posting again.
        reconciled = _reconcile(adapter, message) if _owes_reconcile(row) else None
        result = reconciled or adapter.send(message)
    except SendError as error:
        with engine().begin() as tx:  # failing and recording why: one transaction
            _settle_failure(tx, row, key, token, error, policy)
        return 0
    faults.hit("deliver.after_send")
    if ledger.mark_sent(conn, key, token=token, platform=result.platform,
                        message_id=result.provider_message_id, now=clock.now()):
        return 1
    ledger.record_incident(conn, key, kind="possible_duplicate", now=clock.now(),
                           detail="sent, but the claim had been taken over before it was recorded")
    log.warning("claim lost after send", extra={"action": "possible_duplicate", "delivery": key})
    return 0


def _owes_reconcile(row: dict[str, Any]) -> bool:
    """Taken over (or a retry of a takeover whose look-up could not run yet) on a channel that can
    look for its own earlier message."""
    pending = row["taken_over"] or (row.get("last_error") or "").startswith(UNRECONCILED)
    return pending and hasattr(runtime.adapters().get(row["channel"]), "reconcile")


def _reconcile(adapter: Any, message: Message) -> Any:
    """The earlier attempt's message, or None. A provider that cannot answer now (a rate limit)
    leaves the question open: the release records UNRECONCILED, so the retry asks again instead
    of posting a second copy."""
    try:
        return adapter.reconcile(message)
    except TransientSendError as error:
        raise TransientSendError(UNRECONCILED, str(error), error.retry_after) from error


def _render(row: dict[str, Any]) -> Message:
    ntype = runtime.catalog().get(row["type_key"])
    version = row["template_version"]
    if ntype is None or version not in ntype.templates:
        raise PermanentSendError("template_missing", f"{row['type_key']} v{version} is not in the catalog")
    channel = row["channel"]
    try:
        content = ntype.render(version, channel, row["variables"])
    except Exception as exc:  # a sandbox or undefined-variable error in content we cannot fix by retrying
        raise PermanentSendError("render_failed", str(exc)) from exc
    return Message(delivery_id=row["id"], user_id=row["user_id"], type_key=row["type_key"],
                   occurrence_key=row["occurrence_key"], channel=channel, content=content,
                   attempt=row["attempts"], config=ntype.config.get(channel, {}),
                   address=(row.get("addresses") or {}).get(channel),
                   buttons=ntype.templates[version].buttons)


def _settle_failure(conn: Connection, row: dict[str, Any], key: ledger.Key, token: str,
                    error: SendError, policy: RetryPolicy) -> None:
    now = clock.now()
    retry = decide(error, row["attempts"], policy)
    if retry is not None:
        ledger.release_claim(conn, key, token=token, error=str(error), now=now,
                             not_before=now + timedelta(seconds=retry.delay))
        return
    if ledger.fail_delivery(conn, key, token=token, error=str(error), now=now) is None:
        return
    reason = error.reason if isinstance(error, PermanentSendError) else "retries_exhausted"
    ledger.insert_decisions(conn, [ledger.Decision(
        row["user_id"], row["request_id"], "deliver", "failed", reason, str(error)[:500],
        row["channel"], row["id"])], now=now)
