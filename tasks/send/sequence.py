"""One batch's send sequence: claim, render, send, and record "sent" only after the send.

The route task sends what it routed itself (`send_claimed`: it wrote those rows claimed); the deliver
task claims and sends the rest (`claim_and_send`: retries, held rows whose time came, takeovers of
lapsed leases). Both are entered from tasks/deliver.py.

A claimed row goes through: prepare (adapter, template; nothing is sent) → reconcile, if an
earlier attempt may have sent → begin the send (one conditional update: the claim is still ours,
the lease now covers the whole send budget, and the row says this attempt reached the provider) →
the provider call under a hard deadline (tasks.send.pool) → record the outcome: sent (group
commit: tasks.send.group), failed (retry or fail), or unknown (tasks.send.outcomes decides:
reconcile, resend under the idempotency key, or hold).

Every exception on a row is caught and settled on that row; only a process that dies leaves a
claim behind, and its lease (PostgreSQL's clock) hands the row to the next worker.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Engine

from clarion import clock, faults
from clarion.adapters.base import Adapter
from clarion.db import claims, receipts
from clarion.errors import (
    DeferredSendError,
    PermanentSendError,
    SendError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult
from clarion.rows import ClaimedDelivery
from clarion.settings import Settings
from clarion.tasks import lanes, runtime
from clarion.tasks.send import pool, rate
from clarion.tasks.send.connection import RowConnection
from clarion.tasks.send.group import Sent, SentGroup
from clarion.tasks.send.outcomes import record_exhausted, settle_failure, settle_unknown
from clarion.tasks.send.pool import Senders
from clarion.tasks.send.retry import RetryPolicy

log = logging.getLogger(__name__)
MARGIN = 5.0  # seconds of lease kept beyond a send's budget, to record its outcome
Key = tuple[str, int]  # (user_id, delivery id)


@dataclass(frozen=True)
class Batch:
    """What every row of one deliver message shares."""

    token: str
    policy: RetryPolicy
    budget: float  # seconds one send may take, all its provider calls together
    skew_grace: float  # seconds a type or version this worker lacks waits for a newer worker
    lease: float  # seconds a claim holds before another worker may take it over
    concurrency: int  # the most senders a batch runs (CLARION_SEND_CONCURRENCY)
    engine: Engine
    sent: SentGroup  # the batch's pending "sent" records (group commit)

    @classmethod
    def open(cls, token: str, s: Settings, engine: Engine) -> Batch:
        return cls(
            token,
            RetryPolicy(max_attempts=s.max_attempts),
            s.send_timeout,
            s.catalog_skew_grace,
            s.claim_lease,
            s.send_concurrency,
            engine,
            SentGroup(token, engine, rows=s.sent_flush_rows, wait=s.sent_flush_ms / 1000),
        )


def claim_and_send(keys: list[Key], s: Settings, engine: Engine) -> int:
    """Claim the rows among `keys` that may be sent now and send them; returns the sends
    recorded. Rows another worker holds, or that are done, are skipped by the claim."""
    batch = Batch.open(str(uuid.uuid4()), s, engine)
    try:
        _send_rows(_claim(keys, batch), batch)
    finally:  # the sends already made are recorded, whatever happened to the rest
        recorded = batch.sent.close()
    return recorded


def send_claimed(claimed: list[ClaimedDelivery], token: str, s: Settings, engine: Engine) -> None:
    """Send rows this process claimed already under `token` (the route task inserts the rows
    it sends itself as claimed: ledger.insert_deliveries)."""
    batch = Batch.open(token, s, engine)
    try:
        _send_rows(claimed, batch)
    finally:
        batch.sent.close()


def _claim(keys: list[Key], batch: Batch) -> list[ClaimedDelivery]:
    now = clock.now()
    attempts = batch.policy.max_attempts
    with batch.engine.begin() as conn:
        exhausted = claims.exhaust_deliveries(conn, keys, now=now, max_attempts=attempts)
        record_exhausted(conn, exhausted, now=now)
        claimed = claims.claim_deliveries(
            conn, keys, token=batch.token, now=now, lease=batch.lease, max_attempts=attempts
        )
    runtime.count("deliver_skipped_not_claimable", len(keys) - len(claimed) - len(exhausted))
    return sorted(claimed, key=lambda r: r.key)


def _send_rows(claimed: list[ClaimedDelivery], batch: Batch) -> None:
    faults.hit("deliver.after_claim")
    adapters = runtime.adapters()
    work = pool.Work(
        connect=lambda: RowConnection(batch.engine),
        send=lambda db, rows, senders: _deliver(db, rows, batch, senders),
        overdue=lambda db, row, adapter, error: _settle_unknown_send(
            db, row, batch, adapter, error
        ),
        together=lambda row: getattr(adapters.get(row.channel), "sends_many", False),
    )
    # a bulk lane's batch while transactional work is about: CLARION_BULK_SENDS_BESIDE in flight
    pool.send_all(claimed, work, lanes.sends_beside({r.lane for r in claimed}, batch.concurrency))


@dataclass(frozen=True)
class Ready:
    """A claimed row past every step before its provider call."""

    row: ClaimedDelivery
    adapter: Adapter
    message: Message
    lease: claims.Lease  # what the send runs under
    repeat_possible: bool  # an earlier attempt may have sent, and nobody could find out


def _deliver(
    db: RowConnection, rows: list[ClaimedDelivery], batch: Batch, senders: Senders
) -> None:
    """A sender's rows (one, or a slice of one channel's: tasks.send.pool), each settled whatever
    happens: each made ready (or settled on the way), then the ready ones sent together under
    one budget, then each outcome recorded. An error that cannot even be recorded (the database
    is down) leaves its row to its lease, and the thread goes on."""
    ready: list[Ready] = []
    for row in rows:
        with _unsettled(row):
            if (one := _ready(db, row, batch)) is not None:
                ready.append(one)
    if not ready:
        return
    budget = min(min(batch.budget, r.lease.left() - MARGIN) for r in ready)
    outcomes = senders.call(
        ready[0].adapter, [r.message for r in ready], [r.row for r in ready], budget
    )
    for one, outcome in zip(ready, outcomes, strict=True):
        with _unsettled(one.row):
            _settle_send(db, one, batch, outcome)


@contextlib.contextmanager
def _unsettled(row: ClaimedDelivery) -> Iterator[None]:
    """An error settling `row` is logged, and the row left to its lease."""
    try:
        yield
    except Exception:
        log.exception(
            "delivery not settled", extra={"action": "deliver_unsettled", "delivery": row.key}
        )


def _ready(db: RowConnection, row: ClaimedDelivery, batch: Batch) -> Ready | None:
    """The row ready to send, or None once it was settled (not preparable, an earlier attempt's
    outcome settled it) or its claim was lost."""
    try:
        adapter, message = _prepare(row, batch)
    except SendError as error:
        settle_failure(db, row, batch.token, error, batch.policy)
        return None
    except Exception as exc:  # a bug or an outage before anything was sent: retried, then failed
        log.exception(
            "delivery could not be prepared", extra={"action": "deliver_error", "delivery": row.key}
        )
        internal = TransientSendError("internal_error", _describe(exc))
        settle_failure(db, row, batch.token, internal, batch.policy)
        return None
    repeat_possible = False
    if row.maybe_sent_at is not None:
        earlier = _settle_earlier_attempt(db, row, batch, adapter, message)
        if earlier == "settled":
            return None
        repeat_possible = earlier == "unchecked"
    lease = _lease_for_send(db, row, batch, adapter)
    if lease is None:
        log.info("claim lost before the send", extra={"action": "claim_lost", "delivery": row.key})
        return None
    return Ready(row, adapter, message, lease, repeat_possible)


def _prepare(row: ClaimedDelivery, batch: Batch) -> tuple[Adapter, Message]:
    """The adapter and the rendered message. A type, version or channel this worker does not
    have (a rolling deploy: a newer producer or worker has it) waits for one that does."""
    adapter = runtime.adapters().get(row.channel)
    ntype = runtime.catalog().get(row.type_key)
    if adapter is None:
        raise _skew(
            row, batch, "no_adapter", f"channel {row.channel!r} is not configured on this worker"
        )
    version = row.template_version
    if ntype is None or version not in ntype.templates:  # the file may have it by now
        ntype = runtime.catalog_now().get(row.type_key)
    if ntype is None or version not in ntype.templates:
        raise _skew(
            row, batch, "template_missing", f"{row.type_key} v{version} is not in the catalog"
        )
    try:
        content = ntype.render(version, row.channel, row.variables, row.locale)
    except Exception as exc:  # a sandbox or undefined variable: retrying cannot fix the content
        raise PermanentSendError("render_failed", _describe(exc)) from exc
    return adapter, Message.for_type(
        ntype,
        version,
        row.channel,
        content,
        row.variables,
        delivery_id=row.id,
        user_id=row.user_id,
        occurrence_key=row.occurrence_key,
        attempt=row.attempts,
        address=(row.addresses or {}).get(row.channel),
        lane=row.lane,
    )


def _skew(row: ClaimedDelivery, batch: Batch, reason: str, detail: str) -> SendError:
    age = (clock.now() - row.requested_at).total_seconds()
    if age < batch.skew_grace:
        return DeferredSendError(
            reason, f"{detail}; waiting for a worker that has it", retry_after=10.0
        )
    return PermanentSendError(reason, detail)


def _settle_earlier_attempt(
    db: RowConnection, row: ClaimedDelivery, batch: Batch, adapter: Adapter, message: Message
) -> str:
    """An earlier attempt may have sent: "settled" if that settled the row (found and recorded
    as sent, held, or failed); "checked" if the provider was asked and has not got it (this
    attempt sends, no repeat); "unchecked" if this attempt may send again without knowing (a
    possible repeat). A channel that can look for its own message does; otherwise (or when its
    look-up is inconclusive) tasks.send.outcomes says whether this attempt may send again. The
    earlier attempt's unknown outcome was counted when its answer was lost, unless this claim
    took over its lapsed lease: then it is counted here. The provider's own report naming the
    delivery (db.receipts.evidence: it came while that attempt was in flight) is read first."""
    if _reported(db, row, batch):
        return "settled"
    reconcile = getattr(adapter, "reconcile", None)
    if reconcile is None:
        lost = UnknownSendError(
            "earlier_attempt", "an earlier attempt reached the provider; its answer was lost"
        )
        return _held(db, row, batch, adapter, lost)
    try:
        found = reconcile(message, row.maybe_sent_at)
    except UnknownSendError as error:  # cannot be found out: held or resent, as policy says
        return _held(db, row, batch, adapter, error)
    except SendError as error:
        settle_failure(db, row, batch.token, error, batch.policy)
        return "settled"
    if found is None:
        return "checked"
    log.info("earlier send found", extra={"action": "delivery_reconciled", "delivery": row.key})
    _record_sent(row, batch, found, deadline=time.monotonic() + MARGIN, repeat_possible=False)
    return "settled"


def _reported(db: RowConnection, row: ClaimedDelivery, batch: Batch) -> bool:
    """Record as sent a delivery the provider already reported (a callback, an event); True if
    there was such a report."""
    found = db.run(lambda c: receipts.evidence(c, row.key))
    if found is None:
        return False
    log.info(
        "earlier send reported by the provider",
        extra={"action": "delivery_settled_by_receipt", "delivery": row.key, "event": found.event},
    )
    result = SendResult(platform=found.platform, provider_message_id=found.provider_message_id)
    _record_sent(row, batch, result, deadline=time.monotonic() + MARGIN, repeat_possible=False)
    return True


def _held(
    db: RowConnection, row: ClaimedDelivery, batch: Batch, adapter: Adapter, error: SendError
) -> str:
    """ "settled" if an earlier attempt's unknown outcome holds the row, else "unchecked" (this
    attempt sends again, a possible repeat)."""
    held = settle_unknown(
        db,
        row,
        batch.token,
        error,
        adapter,
        batch.policy,
        checkable=False,
        release=False,
        counted=not row.taken_over,
    )
    return "settled" if held else "unchecked"


def _lease_for_send(
    db: RowConnection, row: ClaimedDelivery, batch: Batch, adapter: Adapter
) -> claims.Lease | None:
    """The lease this send runs under. A channel whose provider dedups by key needs no record that
    the attempt reached it (a takeover resends under the key, and the provider's 409 says whether
    it had arrived), so while the claim's own lease still covers the whole send, nothing is
    written; otherwise begin_send records the attempt and extends the lease (None: claim lost)."""
    need = batch.budget + MARGIN
    claimed = claims.Lease(batch.token, row.claimed_at + row.lease_left)
    if getattr(adapter, "dedups_by_key", False) and claimed.left() > need:
        return claimed
    return db.run(lambda c: claims.begin_send(c, row.key, token=batch.token, need=need))


def _settle_send(
    db: RowConnection, ready: Ready, batch: Batch, outcome: SendResult | Exception
) -> None:
    """Record what the provider call ended in: sent (after the send, by the group commit), failed
    (retried or not), or unknown."""
    row, adapter = ready.row, ready.adapter
    try:
        if isinstance(outcome, Exception):
            raise outcome
        faults.hit("deliver.after_send")
        deadline = ready.lease.ends - 1.0
        _record_sent(row, batch, outcome, deadline=deadline, repeat_possible=ready.repeat_possible)
    except UnknownSendError as error:
        _settle_unknown_send(db, row, batch, adapter, error)
    except SendError as error:
        if not isinstance(error, DeferredSendError):  # a full budget is not a failing provider
            rate.note(row.channel, "failed")
        settle_failure(db, row, batch.token, error, batch.policy)
    except Exception as exc:  # raised once the request may have left: its outcome is unknown
        log.exception(
            "send ended in an error", extra={"action": "deliver_error", "delivery": row.key}
        )
        _settle_unknown_send(
            db, row, batch, adapter, UnknownSendError("internal_error", _describe(exc))
        )


def _settle_unknown_send(
    db: RowConnection, row: ClaimedDelivery, batch: Batch, adapter: Adapter, error: SendError
) -> None:
    rate.note(row.channel, "unknown")
    settle_unknown(db, row, batch.token, error, adapter, batch.policy)


def _record_sent(
    row: ClaimedDelivery,
    batch: Batch,
    result: SendResult,
    *,
    deadline: float,
    repeat_possible: bool,
) -> None:
    """Hand the send to the batch's group commit (tasks.send.group): recorded within
    CLARION_SENT_FLUSH_MS, conditional on the claim token, and counted there."""
    batch.sent.add(Sent(row, result, clock.now(), deadline, repeat_possible))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
