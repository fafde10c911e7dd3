"""Retention: a beat entry on the control lane (hourly, CLARION_RETENTION_DAYS, default 90) removes
finished requests with their deliveries and decisions, receipts, interactions, cleared alerts and
spent gate rows older than the horizon, and in-app inbox items older than CLARION_INBOX_KEEP_DAYS.

Bounded: each statement removes at most CLARION_RETENTION_BATCH rows in its own short transaction
(locks skipped, not waited for), and one run does at most MAX_BATCHES of them per kind; a backlog
(a first run on an old database) is worked off over the following runs. What is never removed,
and why that keeps every occurrence from being sent twice, is in db/retention.py.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import shared_task

from clarion import clock, settings
from clarion.db import retention
from clarion.db.engine import engine

log = logging.getLogger(__name__)
MAX_BATCHES = 20  # per kind and run


def horizons(now: datetime) -> dict[str, datetime]:
    """The cut-off of each horizon kind named in db.retention.STATEMENTS."""
    s = settings.get()
    return {
        "keep": now - timedelta(days=s.retention_days),
        "inbox": now - timedelta(days=s.inbox_keep_days),
        "now": now,
    }


def remove_old(now: datetime | None = None, *, max_batches: int = MAX_BATCHES) -> dict[str, int]:
    """One retention run at `now` (default the clock): rows removed per kind."""
    now = now or clock.now()
    batch, cut = settings.get().retention_batch, horizons(now)
    removed: dict[str, int] = {}
    for kind, (_, which) in retention.STATEMENTS.items():
        removed[kind] = 0
        for _ in range(max_batches):
            with engine().begin() as conn:
                n = retention.remove_batch(conn, kind, horizon=cut[which], batch=batch)
            removed[kind] += n
            if n < batch:
                break
    if any(removed.values()):
        log.info(
            "removed old rows",
            extra={
                "action": "retention_removed",
                **{f"removed_{k}": v for k, v in removed.items()},
            },
        )
    return removed


@shared_task(name="clarion.retention", send_events=False)
def retention_task() -> dict[str, int]:
    return remove_old()
