"""The beat's scheduler: Celery's persistent one, except that an idle tick is not sent at all.

Before sending the every-second `clarion.tick`, beat asks the due indexes the tick's own question
(db/due.py: one read of EXISTS flags) and sends the task only when some step has work. An idle
deployment then costs one read a second in beat and nothing in the control worker: no message,
no task run, no log line (issue 29). When the read fails (the database is away, a migration is
running), the tick is sent as before: the worker's tick has its own handling, and a beat that
could not look must not stop the sweeper that recovers lost work.

An idle tick is still a tick: its probe's duration goes into clarion_tick_seconds from beat's
process, so the count keeps growing once a second (the dashboards and checks that read "the beat
ticked" from it see an idle deployment tick). A tick with work is counted by the worker that runs
it, as before. Celery's "Sending due task" DEBUG line is written only for ticks sent.

Every STATISTICS_EVERY seconds, with the tick, beat also looks for ledger tables that outgrew their
statistics and has them analyzed (db/statistics.py: a plan made on a small table must not go on
reading it whole once it is large; an idle deployment's look finds nothing and logs nothing).

Every other entry (alerts, the events round, retention) is sent on its schedule as Celery does.
The events round runs every second even when nothing is due on purpose: it is the task that makes
an idle pool process look at the catalog file (tasks/app.py), so a process idle while a good edit
was on disk still has it when a broken one follows (tests/acceptance/test_catalog_reload.py).

Celery's scheduler wakes 10 ms before an entry is due and then polls without sleeping until it is
(`Scheduler.adjust` subtracts a 10 ms drift, and a negative interval is not slept): with two
entries every second, that busy loop was most of an idle beat's CPU (bench/RESULTS.md, "An idle
deployment"). This scheduler sleeps until the entry is due.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

from clarion import clock, metrics, settings
from clarion.db.due import what_is_due
from clarion.db.engine import engine
from clarion.db.statistics import Refresher
from clarion.tasks.tick import LANES

log = logging.getLogger(__name__)
TICK = "clarion.tick"
STATISTICS_EVERY = 2.0  # seconds between beat's looks for tables that outgrew their statistics


def tick_has_work() -> bool:
    """Whether a tick now would do anything (True when the database could not be asked)."""
    try:
        with engine().connect() as conn:
            return what_is_due(conn, now=clock.now(), lanes=LANES).anything
    except Exception as exc:  # noqa: BLE001 - fail open: send the tick, whose run reports it
        log.debug("beat: the due probe failed (%s); sending the tick", exc)
        return True


class Scheduler(PersistentScheduler):
    """PersistentScheduler that skips sending a tick with nothing due, and wakes when an entry is
    due rather than polling for it."""

    def adjust(self, n: Any, drift: float = -0.010) -> Any:
        """Seconds to sleep before the next entry: all of them (Celery's own subtracts 10 ms and
        then spins; see the module docstring)."""
        return n

    _statistics: Refresher | None = None
    _statistics_looked = -math.inf

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        if entry.task == TICK:
            self._look_at_statistics()
            started = time.perf_counter()
            if not tick_has_work():
                metrics.TICK_SECONDS.observe(time.perf_counter() - started)
                return
        super().apply_entry(entry, producer=producer)

    def _look_at_statistics(self) -> None:
        now = time.monotonic()
        if now - self._statistics_looked < STATISTICS_EVERY:
            return
        self._statistics_looked = now
        try:
            if self._statistics is None:
                self._statistics = Refresher(engine(), settings.get().schema)
            self._statistics.look()
        except Exception as exc:  # noqa: BLE001 - the database is away: the next look
            log.debug("beat: the statistics look failed (%s)", exc)
