"""Sending: claim, render, send, and record "sent" only after the send.

The route task sends what it routed itself (`send_claimed`: it wrote those rows claimed); the deliver
task claims and sends the rest (retries, held rows whose time came, takeovers of lapsed leases).

A claimed row goes through: prepare (adapter, template; nothing is sent) → reconcile, if an
earlier attempt may have sent → begin the send (one conditional update: the claim is still ours,
the lease now covers the whole send budget, and the row says this attempt reached the provider) →
the provider call under a hard deadline → record the outcome: sent, failed (retry or fail), or
unknown (tasks.outcomes decides: reconcile, resend under the idempotency key, or hold).

Every exception on a row is caught and settled on that row; only a process that dies leaves a
claim behind, and its lease (PostgreSQL's clock) hands the row to the next worker.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from celery import shared_task

from clarion import clock, faults, settings
from clarion.adapters.base import Adapter
from clarion.db import claims
from clarion.db.engine import engine
from clarion.errors import (
    DeferredSendError,
    PermanentSendError,
    SendError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult
from clarion.rows import ClaimedDelivery
from clarion.tasks import runtime, sendrate
from clarion.tasks.outcomes import (
    RowConnection,
    record_exhausted,
    settle_failure,
    settle_unknown,
)
from clarion.tasks.retry import RetryPolicy
from clarion.tasks.sentgroup import Sent, SentGroup

log = logging.getLogger(__name__)
MARGIN = 5.0  # seconds of lease kept beyond a send's budget, to record its outcome


@dataclass(frozen=True)
class Batch:
    """What every row of one deliver message shares."""

    token: str
    policy: RetryPolicy
    budget: float  # seconds one send may take, all its provider calls together
    skew_grace: float  # seconds a type or version this worker lacks waits for a newer worker
    sent: SentGroup  # the batch's pending "sent" records (group commit)


@shared_task(name="clarion.deliver")
def deliver(users: list[str], ids: list[int]) -> int:
    """Deliver a batch; returns the sends recorded. Rows another worker holds, or that are
    done, are skipped by the claim."""
    try:
        return _deliver(users, ids)
    finally:
        sendrate.flush()  # the batch's outcomes, in one Redis round trip


def deliver_now(rows: list[tuple[str, int, str]]) -> int:
    """Deliver (user_id, id, lane) rows in this process, as the deliver task would (a budgeted
    lane's route task sends its own slice: tasks.lanes)."""
    return deliver([r[0] for r in rows], [r[1] for r in rows]) if rows else 0


def send_claimed(claimed: list[ClaimedDelivery], token: str) -> int:
    """Send rows this process claimed already under `token` (the route task inserts the rows
    it sends itself as claimed: ledger.insert_deliveries); returns the sends recorded."""
    if not claimed:
        return 0
    try:
        return _in_batch(token, lambda batch: _send_rows(claimed, batch))
    finally:
        sendrate.flush()


def _deliver(users: list[str], ids: list[int]) -> int:
    return _in_batch(str(uuid.uuid4()), lambda batch: _send_batch(users, ids, batch))


def _in_batch(token: str, work: Callable[[Batch], object]) -> int:
    s = settings.get()
    batch = Batch(
        token,
        RetryPolicy(max_attempts=s.max_attempts),
        s.send_timeout,
        s.catalog_skew_grace,
        SentGroup(token, rows=s.sent_flush_rows, wait=s.sent_flush_ms / 1000),
    )
    try:
        work(batch)
    finally:  # the sends already made are recorded, whatever happened to the rest
        recorded = batch.sent.close()
    return recorded


def _send_batch(users: list[str], ids: list[int], batch: Batch) -> int:
    s = settings.get()
    keys = list(zip(users, ids, strict=True))
    now = clock.now()
    with engine().begin() as conn:
        exhausted = claims.exhaust_deliveries(conn, keys, now=now, max_attempts=s.max_attempts)
        record_exhausted(conn, exhausted, now=now)
        claimed = sorted(
            claims.claim_deliveries(
                conn,
                keys,
                token=batch.token,
                now=now,
                lease=s.claim_lease,
                max_attempts=s.max_attempts,
            ),
            key=lambda r: r.key,
        )
    runtime.count("deliver_skipped_not_claimable", len(ids) - len(claimed) - len(exhausted))
    _send_rows(claimed, batch)
    return len(claimed)


def _send_rows(claimed: list[ClaimedDelivery], batch: Batch) -> None:
    faults.hit("deliver.after_claim")
    if claimed:
        limit = settings.get().send_concurrency
        wanted = max(_pace(c).senders(limit) for c in {r.channel for r in claimed})
        _Senders(claimed, batch, max(1, min(wanted, len(claimed))), limit).run()


class _Pace:
    """How one channel's rows go in this process (moving averages): the wall time a row takes on
    a sender, and how much of it is waiting for the provider's answer. A batch starts as many
    senders as keep one busy while the others wait (Little's law): one or two for a provider
    that answers in a fraction of a millisecond, where more would only contend for the GIL; up
    to CLARION_SEND_CONCURRENCY for one that takes a hundred. The first batch uses them all."""

    ALPHA = 0.05

    def __init__(self) -> None:
        self.row: float | None = None
        self.wait = 0.0

    def note(self, row: float, wait: float) -> None:
        if self.row is None:
            self.row, self.wait = row, wait
        else:
            self.row += self.ALPHA * (row - self.row)
            self.wait += self.ALPHA * (wait - self.wait)

    def senders(self, limit: int) -> int:
        if self.row is None:
            return limit
        work = max(self.row - self.wait, self.row * 0.01, 1e-6)
        return max(1, min(limit, math.ceil(self.row / work)))


_paces: dict[str, _Pace] = {}
_waited = threading.local()  # per sender thread: seconds the current row waited on its provider


def _pace(channel: str) -> _Pace:
    pace = _paces.get(channel)
    if pace is None:
        pace = _paces.setdefault(channel, _Pace())
    return pace


class _Abandoned(BaseException):
    """Raised on a sender whose send outlived its budget: the batch's thread settled the row, and
    this thread drops whatever the call returned and stops (BaseException: nothing on the way
    out may settle the row again)."""


@dataclass(eq=False)
class _Call:
    """A provider call in flight on a sender, and the deadline the batch's thread holds it to."""

    row: ClaimedDelivery
    adapter: Adapter
    budget: float
    deadline: float  # time.monotonic()
    abandoned: bool = False
    started: float = field(default_factory=time.monotonic)


class _Senders:
    """A batch's sends on `senders` threads. Each sender takes the next row and calls the provider on
    its own thread (no hand-off per send); the batch's thread watches every call's deadline and,
    once one passes, settles that row as unknown while its lease still covers it, and starts a
    sender in place of the one left waiting (its call ends on its own timeouts, unheeded)."""

    def __init__(self, rows: list[ClaimedDelivery], batch: Batch, senders: int, limit: int) -> None:
        self.batch = batch
        self.todo = deque(rows)
        self.senders = senders
        self.limit = limit  # CLARION_SEND_CONCURRENCY: a provider that slows down gets up to this
        self.cond = threading.Condition()
        self.calls: set[_Call] = set()
        self.running = 0  # senders still sending for this batch (not abandoned, not done)
        self.watching = math.inf  # the deadline the batch's thread sleeps until

    def run(self) -> None:
        for _ in range(self.senders):
            self._start()
        db = RowConnection()
        try:
            while (overdue := self._wait()) is not None:
                for call in overdue:
                    error = UnknownSendError(
                        "deadline", f"no answer within the {call.budget:.1f} s send budget"
                    )
                    try:
                        _settle_unknown_send(db, call.row, self.batch, call.adapter, error)
                    except Exception:  # the database is down: the row is left to its lease
                        log.exception(
                            "delivery not settled",
                            extra={"action": "deliver_unsettled", "delivery": call.row.key},
                        )
                    if self.todo:
                        self._start()
        finally:
            db.close()

    def _start(self) -> None:
        with self.cond:
            self.running += 1
        _threads().run(self._sender)

    def _more(self, wanted: int) -> None:
        """One more sender for the rest of the batch, if the provider got slower than the batch
        was started for (never more than the rows left, nor the limit)."""
        with self.cond:
            more = self.running < min(wanted, len(self.todo))
            if more:
                self.running += 1
        if more:
            _threads().run(self._sender)

    def _wait(self) -> list[_Call] | None:
        """The calls past their deadline, now abandoned; None once every sender is done."""
        with self.cond:
            while self.running:
                now = time.monotonic()
                overdue = [c for c in self.calls if c.deadline <= now]
                if overdue:
                    for call in overdue:
                        call.abandoned = True
                        self.calls.discard(call)
                    self.running -= len(overdue)
                    return overdue
                self.watching = min((c.deadline for c in self.calls), default=math.inf)
                self.cond.wait(None if self.watching == math.inf else self.watching - now)
            return None

    def _sender(self) -> None:
        db = RowConnection()  # auto-committing: "sent" is durable once PostgreSQL answers
        abandoned = False
        try:
            while (row := self._next()) is not None:
                began, _waited.seconds = time.monotonic(), 0.0
                _deliver_one(db, row, self.batch, self)
                pace = _pace(row.channel)
                pace.note(time.monotonic() - began, _waited.seconds)
                self._more(pace.senders(self.limit))
        except _Abandoned:
            abandoned = True  # the batch's thread counted this sender out and settled its row
        finally:
            db.close()
            if not abandoned:
                with self.cond:
                    self.running -= 1
                    self.cond.notify_all()

    def _next(self) -> ClaimedDelivery | None:
        with self.cond:
            return self.todo.popleft() if self.todo else None

    def call(
        self, adapter: Adapter, message: Message, row: ClaimedDelivery, budget: float
    ) -> SendResult:
        """adapter.send under a hard wall-clock budget, on this sender's thread. Past the budget
        the batch's thread settles the row as unknown, and this raises _Abandoned when (if) the
        call comes back."""
        budget = max(0.1, budget)
        call = _Call(row, adapter, budget, time.monotonic() + budget)
        with self.cond:
            self.calls.add(call)
            if call.deadline < self.watching:  # else the watch wakes early enough already
                self.cond.notify_all()
        try:
            return adapter.send(message)
        finally:
            _waited.seconds = getattr(_waited, "seconds", 0.0) + time.monotonic() - call.started
            with self.cond:
                self.calls.discard(call)
                if call.abandoned:
                    raise _Abandoned  # what the call did no longer counts


def _deliver_one(db: RowConnection, row: ClaimedDelivery, batch: Batch, senders: _Senders) -> int:
    """One row, whatever happens: an error that cannot even be recorded (the database is down)
    leaves the row to its lease, and the thread goes on with the next."""
    try:
        return _deliver_row(db, row, batch, senders)
    except Exception:
        log.exception(
            "delivery not settled", extra={"action": "deliver_unsettled", "delivery": row.key}
        )
        return 0


def _deliver_row(db: RowConnection, row: ClaimedDelivery, batch: Batch, senders: _Senders) -> int:
    try:
        adapter, message = _prepare(row, batch)
    except SendError as error:
        settle_failure(db, row, batch.token, error, batch.policy)
        return 0
    except Exception as exc:  # a bug or an outage before anything was sent: retried, then failed
        log.exception(
            "delivery could not be prepared", extra={"action": "deliver_error", "delivery": row.key}
        )
        settle_failure(
            db, row, batch.token, TransientSendError("internal_error", _describe(exc)), batch.policy
        )
        return 0
    checked = False
    if row.maybe_sent_at is not None:
        found = _settle_earlier_attempt(db, row, batch, adapter, message)
        if found is not None:
            return found
        checked = hasattr(adapter, "reconcile")
    return _send(
        db,
        row,
        batch,
        senders,
        adapter,
        message,
        repeat_possible=row.maybe_sent_at is not None and not checked,
    )


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
) -> int | None:
    """An earlier attempt may have sent. A channel that can look for its own message does
    (found: recorded as sent, 1); otherwise tasks.outcomes says whether this attempt may send
    again (None: go on) or must hold (0). The earlier attempt's unknown outcome was counted when
    its answer was lost, unless this claim took over its lapsed lease: then it is counted here."""
    reconcile = getattr(adapter, "reconcile", None)
    if reconcile is not None:
        try:
            found = reconcile(message, row.maybe_sent_at)
        except UnknownSendError as error:  # cannot be found out: held or resent, as policy says
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
            return 0 if held else None
        except SendError as error:
            settle_failure(db, row, batch.token, error, batch.policy)
            return 0
        if found is not None:
            log.info(
                "earlier send found", extra={"action": "delivery_reconciled", "delivery": row.key}
            )
            return _record_sent(
                db, row, batch, found, deadline=time.monotonic() + MARGIN, repeat_possible=False
            )
        return None
    lost = UnknownSendError(
        "earlier_attempt", "an earlier attempt reached the provider; its answer was lost"
    )
    held = settle_unknown(
        db,
        row,
        batch.token,
        lost,
        adapter,
        batch.policy,
        checkable=False,
        release=False,
        counted=not row.taken_over,
    )
    return 0 if held else None


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


def _send(
    db: RowConnection,
    row: ClaimedDelivery,
    batch: Batch,
    senders: _Senders,
    adapter: Adapter,
    message: Message,
    *,
    repeat_possible: bool,
) -> int:
    lease = _lease_for_send(db, row, batch, adapter)
    if lease is None:
        log.info("claim lost before the send", extra={"action": "claim_lost", "delivery": row.key})
        return 0
    deadline = lease.ends - 1.0
    try:
        result = senders.call(adapter, message, row, min(batch.budget, lease.left() - MARGIN))
        faults.hit("deliver.after_send")
        return _record_sent(
            db, row, batch, result, deadline=deadline, repeat_possible=repeat_possible
        )
    except UnknownSendError as error:
        _settle_unknown_send(db, row, batch, adapter, error)
    except SendError as error:
        if not isinstance(error, DeferredSendError):  # a full budget is not a failing provider
            sendrate.note(row.channel, "failed")
        settle_failure(db, row, batch.token, error, batch.policy)
    except Exception as exc:  # raised once the request may have left: its outcome is unknown
        sendrate.note(row.channel, "unknown")
        log.exception(
            "send ended in an error", extra={"action": "deliver_error", "delivery": row.key}
        )
        settle_unknown(
            db,
            row,
            batch.token,
            UnknownSendError("internal_error", _describe(exc)),
            adapter,
            batch.policy,
        )
    return 0


class _Threads:
    """A process's sender threads, kept between batches (starting a thread costs a round trip
    through the scheduler). A new one starts whenever none is idle, so threads left waiting on
    stalled calls never hold a batch up; at most `keep` wait idle."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def run(self, work: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name="clarion-send", daemon=True
            ).start()
        inbox.put(work)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()  # a sender: it catches what a row raises
            with self._lock:
                if len(self._idle) >= self.keep:
                    return
                self._idle.append(inbox)


@runtime.per_process
def _threads() -> _Threads:
    return _Threads()


def _settle_unknown_send(
    db: RowConnection, row: ClaimedDelivery, batch: Batch, adapter: Adapter, error: SendError
) -> None:
    sendrate.note(row.channel, "unknown")
    settle_unknown(db, row, batch.token, error, adapter, batch.policy)


def _record_sent(
    db: RowConnection,
    row: ClaimedDelivery,
    batch: Batch,
    result: SendResult,
    *,
    deadline: float,
    repeat_possible: bool,
) -> int:
    """Hand the send to the batch's group commit (tasks.sentgroup): recorded within
    CLARION_SENT_FLUSH_MS, conditional on the claim token; counted there, so this returns 0."""
    batch.sent.add(Sent(row, result, clock.now(), deadline, repeat_possible))
    return 0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
