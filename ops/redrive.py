"""`clarion redrive`: put failed (or unknown) deliveries back to pending, with --dry-run first.

Each redriven delivery is the same row (same idempotency key), pending and due now, with attempts
reset and the error cleared; the tick republishes it. A decision with gate `redrive` keeps the trail:
what state and reason it had, after how many attempts, and its last error.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from clarion import clock
from clarion.db import ledger
from clarion.db import redrive as store
from clarion.db.engine import engine
from clarion.errors import InvalidRequest
from clarion.ops.table import render

log = logging.getLogger(__name__)
SHOWN = 20  # rows listed one by one; the counts cover them all
UNITS = {"d": "days", "h": "hours", "m": "minutes"}


@dataclass(frozen=True)
class Filters:
    states: tuple[str, ...] = ("failed",)
    type_key: str | None = None
    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 1000


def parse_time(value: str | None, option: str, now: datetime) -> datetime | None:
    """'2d', '6h', '30m' before now, or an ISO time with a zone; None when not given."""
    if not value:
        return None
    if value[-1:] in UNITS and value[:-1].isdigit():
        return now - timedelta(**{UNITS[value[-1]]: int(value[:-1])})
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidRequest(f"{option} takes 2d, 6h, 30m or an ISO time, not {value!r}") from exc
    if parsed.tzinfo is None:
        raise InvalidRequest(f"{option} needs a time zone, e.g. 2026-11-01T00:00+00:00")
    return parsed


def redrive(filters: Filters, *, dry_run: bool, now: datetime | None = None) -> str:
    """Find what matches; unless dry_run, re-queue it in one transaction. Returns the report."""
    if filters.limit < 1:
        raise InvalidRequest(f"--limit must be a positive whole number, not {filters.limit}")
    if unknown := set(filters.states) - set(store.REDRIVABLE_STATES):
        raise InvalidRequest(
            f"--state takes {' or '.join(store.REDRIVABLE_STATES)}, not {sorted(unknown)}"
        )
    now = now or clock.now()
    with engine().begin() as conn:
        found = store.find_redrivable(
            conn,
            states=filters.states,
            type_key=filters.type_key,
            reason=filters.reason,
            since=filters.since,
            until=filters.until,
            limit=filters.limit,
        )
        if dry_run:
            return report(found, filters, dry_run=True)
        done = store.requeue(
            conn, [(r.user_id, r.id) for r in found], states=filters.states, now=now
        )
        requeued = [r for r in found if (r.user_id, r.id) in done]
        ledger.insert_decisions(conn, [_trail(r) for r in requeued], now=now)
    log.info(
        "deliveries redriven",
        extra={
            "action": "deliveries_redriven",
            "count": len(requeued),
            "skipped": len(found) - len(requeued),
        },
    )
    return report(requeued, filters, dry_run=False, skipped=len(found) - len(requeued))


def _trail(row: store.Redrivable) -> ledger.Decision:
    detail = (
        f"redriven from {row.state}"
        + (f" ({row.reason})" if row.reason else "")
        + f" after {row.attempts} attempt(s)"
        + (f": {row.last_error[:300]}" if row.last_error else "")
    )
    return ledger.Decision(
        row.user_id, row.request_id, "redrive", "requeue", "redrive", detail, row.channel, row.id
    )


def report(
    rows: list[store.Redrivable], filters: Filters, *, dry_run: bool, skipped: int = 0
) -> str:
    """Counts by type, reason and state, then the first SHOWN rows."""
    verb = "would be re-queued (dry run: nothing changed)" if dry_run else "re-queued"
    head = f"{len(rows)} deliveries {verb}"
    if len(rows) == filters.limit:
        head += f"; --limit {filters.limit} reached, run again for more"
    if skipped:
        head += f"; {skipped} changed state meanwhile and were left alone"
    counts = Counter((r.type_key, r.reason or "-", r.state) for r in rows)
    by_kind = render(
        ["type", "reason", "state", "count"],
        [(*k, n) for k, n in sorted(counts.items())],
        title="by type and reason",
    )
    first = render(
        ["user", "delivery", "type", "channel", "state", "reason", "attempts", "stopped at"],
        [
            (
                r.user_id,
                r.id,
                r.type_key,
                r.channel,
                r.state,
                r.reason or "-",
                r.attempts,
                r.stopped_at.strftime("%Y-%m-%d %H:%M:%S"),
            )
            for r in rows[:SHOWN]
        ],
        title=f"first {min(SHOWN, len(rows))}" if rows else "deliveries",
    )
    return "\n\n".join([head, by_kind, first])
