"""Group commit of "sent" records: one conditional UPDATE for many sends, a few ms after them.

A deliver batch hands each send the provider accepted to its `SentGroup` (`add`). A flusher
thread writes what is pending with one statement (`db.claims.mark_sent_many`, conditional on the
claim token, like the single-row mark) as soon as CLARION_SENT_FLUSH_ROWS sends are pending or the
oldest has waited CLARION_SENT_FLUSH_MS, and once more when the batch ends (`close`).

"Sent is recorded after the send" still holds: nothing is marked before the provider answered.
What changes is the crash window. A process killed after a send and before its flush leaves the
row claimed, exactly as a kill between one send and its own UPDATE did; the next attempt settles
it by the unknown-outcome policy (tasks.send.outcomes.unknown_action). At most
CLARION_SENT_FLUSH_ROWS sends wait for a flush at once: a sending thread that brings the group
to that size waits for the flush before it sends again; so a kill leaves at most that many, plus
the sends still in flight (CLARION_SEND_CONCURRENCY), per process. CLARION_SENT_FLUSH_ROWS=1 is
the old behaviour: one statement per send.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from clarion import clock, faults, metrics
from clarion.db import claims, ledger
from clarion.db.claims import SentMark
from clarion.records import SendResult, clean_provider_id
from clarion.rows import ClaimedDelivery
from clarion.tasks.send import rate
from clarion.tasks.send.connection import RowConnection
from clarion.tasks.send.outcomes import record_incident

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sent:
    """A send the provider accepted, waiting to be recorded."""

    row: ClaimedDelivery
    result: SendResult
    at: datetime  # when the provider answered (clarion's clock): the row's sent_at
    deadline: float  # time.monotonic() past which the record is given up (the lease runs out)
    repeat_possible: bool  # an earlier attempt may have sent, and nobody checked

    def mark(self) -> SentMark:
        platform = clean_provider_id(self.result.platform) or self.row.channel
        return SentMark(
            self.row.key, platform, clean_provider_id(self.result.provider_message_id), self.at
        )


class SentGroup:
    """The pending "sent" records of one deliver batch (one claim token) and their flusher."""

    def __init__(self, token: str, engine: Engine, *, rows: int, wait: float) -> None:
        self.token = token
        self.rows = max(1, rows)
        self.wait = wait  # seconds the oldest pending send may wait
        self.recorded = 0  # sends recorded as ours
        self._cond = threading.Condition()
        self._pending: list[Sent] = []
        self._oldest = 0.0
        self._added = 0  # sends handed to add()
        self._done = 0  # of those, the ones whose flush has finished
        self._waiting = 0  # senders in add() waiting for a flush
        self._closed = False
        self._thread: threading.Thread | None = None
        self._db = RowConnection(engine)

    def add(self, sent: Sent) -> None:
        """Queue one send's record. Returns at once, unless `rows` sends now wait unrecorded
        (pending, or in the flush being written): then only after the flush that records this
        one, so a sending thread never runs ahead of the bound."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="clarion-sent-flush", daemon=True
                )
                self._thread.start()
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending.append(sent)
            self._added += 1
            if self._unrecorded() < self.rows:
                return
            self._cond.notify_all()
            mine = self._added
            self._waiting += 1
            try:
                while self._done < mine and self._thread.is_alive():
                    self._cond.wait(1.0)
            finally:
                self._waiting -= 1

    def _unrecorded(self) -> int:
        """Accepted sends not yet through a flush: pending, and the group being written."""
        return self._added - self._done

    def close(self) -> int:
        """Flush what is pending and stop the flusher; returns the sends recorded as ours."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        self._db.close()
        return self.recorded

    def _run(self) -> None:
        while (group := self._next()) is not None:
            try:
                self._flush(group)
            except Exception:  # the rows stay claimed; their lease hands them on
                log.exception("sent records lost", extra={"action": "deliver_unsettled"})
            with self._cond:
                self._done += len(group)
                if self._waiting:  # a sender held back by the bound (waking none costs nothing)
                    self._cond.notify_all()

    def _next(self) -> list[Sent] | None:
        """Wait until the group is due (full, old enough, or the batch ended); None: done."""
        with self._cond:
            while True:
                if self._pending:
                    left = self._oldest + self.wait - time.monotonic()
                    if self._closed or self._unrecorded() >= self.rows or left <= 0:
                        group, self._pending = self._pending, []
                        return group
                    self._cond.wait(left)
                elif self._closed:
                    return None
                else:
                    self._cond.wait()

    def _flush(self, group: list[Sent]) -> None:
        faults.hit("deliver.before_flush")
        won = self._write(group, lambda: min(s.deadline for s in group))
        if won is None:
            for sent in group:
                log.error(
                    "sent, but not recorded",
                    extra={"action": "sent_not_recorded", "delivery": sent.row.key},
                )
            return
        recorded = [s for s in group if s.row.key in won]
        for sent in group:
            if sent.row.key not in won:
                record_incident(
                    self._db,
                    sent.row,
                    "possible_duplicate",
                    "sent, but the claim had been taken over before it was recorded",
                )
        self.recorded += len(recorded)
        self._count(recorded)

    @staticmethod
    def _count(recorded: list[Sent]) -> None:
        """The metrics of sends just recorded: per lane and channel once a group (a labelled
        child is looked up and its file locked per call, which per row cost more than the
        rest of the record), each send's latency on its own."""
        by: dict[tuple[str, str], list[Sent]] = {}
        for sent in recorded:
            by.setdefault((sent.row.lane, sent.row.channel), []).append(sent)
        now = clock.now()
        for (lane, channel), sends in by.items():
            rate.note(channel, "sent", len(sends))
            metrics.SENDS.labels(lane, channel, "sent").inc(len(sends))
            latency = metrics.EVENT_TO_SENT.labels(lane, channel)
            for sent in sends:
                latency.observe(max(0.0, (now - sent.row.requested_at).total_seconds()))
        for sent in recorded:
            incident = _repeat_incident(sent)
            if incident is not None:  # written with the mark (_write)
                metrics.INCIDENTS.labels(incident[0]).inc()
                log.warning(
                    "incident: %s",
                    incident[0],
                    extra={"action": incident[0], "delivery": sent.row.key},
                )

    def _write(
        self, group: list[Sent], deadline: Callable[[], float]
    ) -> set[tuple[str, int]] | None:
        """mark_sent_many and the repeat incidents of the rows it recorded, in one transaction
        (a kill between the two must not leave a repeat without its incident; a group that owes
        none is one auto-committed statement on the group's connection), retried on a fresh
        connection while the leases last (a database restart must not turn a send into a
        resend). None: given up; the rows are left to their leases, and the next attempt knows
        this one reached the provider."""
        marks = [s.mark() for s in group]
        owed = [(s, incident) for s in group if (incident := _repeat_incident(s)) is not None]
        pause = 0.1
        while True:
            try:
                if not owed:
                    return self._db.run(lambda c: claims.mark_sent_many(c, marks, token=self.token))
                with self._db.begin() as conn:
                    won = claims.mark_sent_many(conn, marks, token=self.token)
                    for sent, (kind, detail) in owed:
                        if sent.row.key in won:
                            ledger.record_incident(
                                conn, sent.row.key, kind=kind, detail=detail, now=sent.at
                            )
                    return won
            except DBAPIError:
                if time.monotonic() + pause > deadline():
                    return None
                time.sleep(pause)
                pause = min(2.0, pause * 2)


def _repeat_incident(sent: Sent) -> tuple[str, str] | None:
    """(kind, detail) of the incident a recorded send owes, if any: the provider said it had the
    key (`repeat`), or it was sent again where an earlier attempt may have arrived and nobody could
    check (`possible_duplicate`)."""
    result = sent.result
    if result.repeat:
        return (
            "repeat",
            "the provider already had this idempotency key: an earlier attempt had arrived; "
            "the repeat was dropped",
        )
    if sent.repeat_possible and result.repeat is None:
        return (
            "possible_duplicate",
            "sent again after an attempt whose outcome was unknown; the provider cannot dedup",
        )
    return None
