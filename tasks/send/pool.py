"""The sender pool: a batch's rows sent on a few threads, each provider call under a hard deadline.

How many senders a batch starts follows each channel's pace in this process (`Pace`, Little's
law): one or two for a provider that answers in a fraction of a millisecond, where more would only
contend for the GIL; up to CLARION_SEND_CONCURRENCY for one that takes a hundred. A batch adds
senders when its rows come back slower than it was started for. Threads are kept between batches
(`Threads`).

A sender takes one row at a time, except for a fast provider (`Pace.fast`: its calls take under
5 ms a row) on a channel that puts several calls in flight at once (the webhook's
`send_many`): then one sender takes the batch's rows in slices of up to CLARION_SEND_CONCURRENCY,
writes a slice's requests together and waits once for their answers. Against a fast receiver a
send costs its thread more in wake-ups (caches gone cold after each wait) than in work: slices
took 10-17% off the workers' CPU per notification in bench/throughput.py. A slice waits for its
slowest answer, which is why only a fast provider's rows go in slices. What a
sender does with its rows is the caller's (tasks.send.sequence); the pool only runs it, and
settles a call that outlives its budget through the caller's `overdue`.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

from clarion.adapters.base import Adapter, SendsMany
from clarion.errors import UnknownSendError
from clarion.records import Message, SendResult
from clarion.rows import ClaimedDelivery
from clarion.tasks import runtime
from clarion.tasks.send.connection import RowConnection

log = logging.getLogger(__name__)


class Pace:
    """How one channel's rows go in this process (moving averages): the wall time a row takes on
    a sender, and how much of it is waiting for the provider's answer. A batch starts as many
    senders as keep one busy while the others wait. The first batch uses them all. A provider
    whose rows wait under FAST each is `fast`: its rows may go out in slices."""

    ALPHA = 0.05
    FAST = 0.005  # seconds a row waits: this quick, a send costs more in wake-ups than in waiting

    def __init__(self) -> None:
        self.row: float | None = None
        self.wait = 0.0

    def fast(self) -> bool:
        return self.row is not None and self.wait < self.FAST

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


paces: dict[str, Pace] = {}  # channel -> its pace in this process
_waited = threading.local()  # per sender thread: seconds the current row waited on its provider


def pace(channel: str) -> Pace:
    found = paces.get(channel)
    if found is None:
        found = paces.setdefault(channel, Pace())
    return found


def wanted(channels: Iterable[str], limit: int) -> int:
    """The senders a batch over `channels` starts with: what its slowest channel needs."""
    return max((pace(c).senders(limit) for c in channels), default=1)


class Abandoned(BaseException):
    """Raised on a sender whose send outlived its budget: the batch's thread settled the row, and
    this thread drops whatever the call returned and stops (BaseException: nothing on the way
    out may settle the row again)."""


@dataclass(eq=False)
class Call:
    """A provider call in flight on a sender, and the deadline the batch's thread holds it to."""

    row: ClaimedDelivery
    adapter: Adapter
    budget: float
    deadline: float  # time.monotonic()
    abandoned: bool = False
    started: float = field(default_factory=time.monotonic)
    thread: threading.Thread = field(default_factory=threading.current_thread)  # the sender's


# What a sender does with its rows (one, or a slice of one channel's: it settles each, whatever
# happens), and how the batch's thread settles a row whose call outlived its budget.
SendRows = Callable[[RowConnection, list[ClaimedDelivery], "Senders"], None]
Overdue = Callable[[RowConnection, ClaimedDelivery, Adapter, UnknownSendError], None]


@dataclass(frozen=True)
class Work:
    """What a batch hands the pool: a connection per sender, the two settling steps, and which
    rows may go out in slices (their channel puts several calls in flight at once)."""

    connect: Callable[[], RowConnection]
    send: SendRows
    overdue: Overdue
    together: Callable[[ClaimedDelivery], bool] = lambda row: False


class Senders:
    """A batch's sends on `senders` threads. Each sender takes the next row and calls the provider on
    its own thread (no hand-off per send); the batch's thread watches every call's deadline and,
    once one passes, settles that row as unknown while its lease still covers it, and starts a
    sender in place of the one left waiting (its call ends on its own timeouts, unheeded).

    The batch ends when no sender is queued and none is live. A live sender is a thread inside
    `_sender`, taken out by that frame's own `finally` (or by the batch's thread when it abandons
    the sender's call): a set of threads, not a count that every exit path must keep right, and
    the batch's thread looks at them at least every WATCH seconds, so a sender that vanished or a
    hand-off no thread took is logged as the bug it is and cannot hold the batch, and with it the
    worker, forever."""

    WATCH = 5.0  # seconds between the batch thread's looks at its senders when no deadline is near
    SLICE = 8  # rows a sender takes together at most (a fast provider, several calls in flight)
    LOST = 30.0  # a sender queued this long without a thread starting it was lost

    def __init__(self, rows: list[ClaimedDelivery], work: Work, senders: int, limit: int) -> None:
        self.work = work
        self.todo = deque(rows)
        self.senders = senders
        self.limit = limit  # CLARION_SEND_CONCURRENCY: a provider that slows down gets up to this
        self.cond = threading.Condition()
        self.calls: set[Call] = set()
        self.queued: list[float] = []  # when each sender handed to a thread but not begun was
        self.live: set[threading.Thread] = set()  # threads in _sender, not abandoned
        self.watching = math.inf  # the deadline the batch's thread sleeps until

    @property
    def running(self) -> int:
        """Senders the batch still waits for (queued or live)."""
        return len(self.queued) + len(self.live)

    def run(self) -> None:
        for _ in range(self.senders):
            self._start()
        db = self.work.connect()
        try:
            while (overdue := self._wait()) is not None:
                for call in overdue:
                    self._settle_overdue(db, call)
                for _ in {call.thread for call in overdue}:  # one sender in place of each left
                    if self.todo:
                        self._start()
        finally:
            db.close()

    def _settle_overdue(self, db: RowConnection, call: Call) -> None:
        error = UnknownSendError(
            "deadline", f"no answer within the {call.budget:.1f} s send budget"
        )
        try:
            self.work.overdue(db, call.row, call.adapter, error)
        except Exception:  # the database is down: the row is left to its lease
            log.exception(
                "delivery not settled",
                extra={"action": "deliver_unsettled", "delivery": call.row.key},
            )

    def _start(self) -> None:
        with self.cond:
            self.queued.append(time.monotonic())
        self._hand_off()

    def _more(self, wanted: int) -> None:
        """One more sender for the rest of the batch, if the provider got slower than the batch
        was started for (never more than the rows left, nor the limit)."""
        with self.cond:
            more = self.running < min(wanted, len(self.todo))
            if more:
                self.queued.append(time.monotonic())
        if more:
            self._hand_off()

    def _hand_off(self) -> None:
        try:
            _threads().run(self._sender)
        except BaseException:  # no thread took it (none could be started): not queued after all
            with self.cond:
                self.queued.pop()
                self.cond.notify_all()
            raise

    def _wait(self) -> list[Call] | None:
        """The calls past their deadline, now abandoned; None once every sender is done."""
        with self.cond:
            while self.running:
                now = time.monotonic()
                overdue = [c for c in self.calls if c.deadline <= now]
                if overdue:
                    for call in overdue:
                        call.abandoned = True
                        self.calls.discard(call)
                        self.live.discard(call.thread)
                    return overdue
                self._look(now)
                self.watching = min((c.deadline for c in self.calls), default=math.inf)
                self.cond.wait(min(self.watching - now, self.WATCH))
            return None

    def _look(self, now: float) -> None:
        """Drop senders that can no longer end on their own (called under the condition): a
        thread that died outside `_sender`'s frame, a hand-off no thread started. Neither can
        happen; if one does, the batch goes on without it and says so."""
        dead = [t for t in self.live if not t.is_alive()]
        lost = [q for q in self.queued if now - q > self.LOST]
        if dead or lost:
            log.error(
                "send pool: senders lost",
                extra={"action": "deliver_senders_lost", "dead": len(dead), "lost": len(lost)},
            )
            self.live.difference_update(dead)
            del self.queued[: len(lost)]  # the oldest first: queued in time order

    def _sender(self) -> None:
        me = threading.current_thread()
        with self.cond:
            if self.queued:
                self.queued.pop(0)
            self.live.add(me)
        try:
            # inside the try: a connection that cannot be opened (the database failing over, this
            # host cut off) must still take this sender out, or the batch's thread waits for it
            db = self.work.connect()  # auto-committing: "sent" is durable once PostgreSQL answers
            try:
                while rows := self._next():
                    began, _waited.seconds = time.monotonic(), 0.0
                    self.work.send(db, rows, self)
                    channel = pace(rows[0].channel)
                    took, waited = time.monotonic() - began, _waited.seconds
                    for _ in rows:
                        channel.note(took / len(rows), waited / len(rows))
                    if len(rows) == 1:  # a slice already has the batch's share in flight
                        self._more(channel.senders(self.limit))
            finally:
                db.close()
        except Abandoned:
            pass  # the batch's thread took this sender out and settled its row
        except Exception:  # no connection (the database failing over): its rows wait for the lease
            log.exception("sender stopped", extra={"action": "deliver_sender_stopped"})
        finally:
            with self.cond:
                self.live.discard(me)
                self.cond.notify_all()

    def _next(self) -> list[ClaimedDelivery]:
        """The next row; for a fast provider whose channel has several calls in flight at once,
        a slice: the rows of its channel next in line, up to the batch's share of
        CLARION_SEND_CONCURRENCY (the limit over the senders running)."""
        with self.cond:
            if not self.todo:
                return []
            first = self.todo.popleft()
            rows = [first]
            if self.work.together(first) and pace(first.channel).fast():
                share = min(self.SLICE, self.limit // max(1, len(self.live)))
                while len(rows) < share and self.todo and self.todo[0].channel == first.channel:
                    rows.append(self.todo.popleft())
            return rows

    def call(
        self,
        adapter: Adapter,
        messages: list[Message],
        rows: list[ClaimedDelivery],
        budget: float,
    ) -> list[SendResult | Exception]:
        """The messages sent under one hard wall-clock budget, on this sender's thread: each one's
        SendResult or the exception its send ended in, in order. Several go through
        `adapter.send_many` (their calls in flight together), one through `adapter.send`. Past
        the budget the batch's thread settles every row as unknown, and this raises Abandoned
        when (if) the calls come back."""
        budget = max(0.1, budget)
        deadline = time.monotonic() + budget
        calls = [Call(row, adapter, budget, deadline) for row in rows]  # one deadline: all go
        with self.cond:
            self.calls.update(calls)
            if deadline < self.watching:  # else the watch wakes early enough already
                self.cond.notify_all()
        try:
            try:
                if len(messages) > 1:
                    return list(cast(SendsMany, adapter).send_many(messages))
                return [adapter.send(messages[0])]
            except Exception as exc:  # one send's error; from send_many, a bug: each row's
                return [exc] * len(messages)
        finally:
            _waited.seconds = getattr(_waited, "seconds", 0.0) + time.monotonic() - calls[0].started
            with self.cond:
                self.calls.difference_update(calls)
                if any(call.abandoned for call in calls):
                    raise Abandoned  # what the calls did no longer counts


def send_all(rows: list[ClaimedDelivery], work: Work, limit: int) -> None:
    """Send `rows` on as many senders as their channels' pace asks for (at most `limit`)."""
    if rows:
        senders = max(1, min(wanted({r.channel for r in rows}, limit), len(rows)))
        if all(work.together(r) and pace(r.channel).fast() for r in rows):
            senders = 1  # one sender has the batch's limit in flight, in slices
        Senders(rows, work, senders, limit).run()


class Threads:
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
            inbox.get()()  # a sender: it catches and logs what it meets
            with self._lock:
                if len(self._idle) >= self.keep:
                    return
                self._idle.append(inbox)


@runtime.per_process
def _threads() -> Threads:
    return Threads()
