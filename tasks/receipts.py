"""Provider receipts and inbound keywords into the ledger (db.receipts), for the web doors."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from clarion import clock, metrics
from clarion.db import receipts as ledger
from clarion.db.engine import engine
from clarion.records import Keyword, Receipt
from clarion.tasks import runtime

log = logging.getLogger(__name__)


def category_of(type_key: str) -> str | None:
    ntype = runtime.catalog().get(type_key)
    return ntype.category if ntype is not None else None


def ingest(items: Iterable[Receipt]) -> Counter[str]:
    """Apply receipts, all in one transaction (a provider retries the whole batch on an error);
    how many had each outcome."""
    outcomes: Counter[str] = Counter()
    seen: Counter[tuple[str, str, str]] = Counter()
    delivered: list[tuple[str, float]] = []
    now = clock.now()

    def on_delivered(channel: str, requested_at: datetime) -> None:
        delivered.append((channel, max(0.0, (now - requested_at).total_seconds())))

    with engine().begin() as conn:
        for receipt in items:
            outcome = ledger.apply_receipt(
                conn, receipt, now=now, category_of=category_of, on_delivered=on_delivered
            )
            outcomes[outcome] += 1
            seen[(receipt.channel, receipt.event, outcome)] += 1
    for outcome, n in outcomes.items():  # counted once the transaction has committed
        runtime.count(f"receipts_{outcome}", n)
    for labels, n in seen.items():
        metrics.RECEIPTS.labels(*labels).inc(n)
    for channel, seconds in delivered:
        metrics.EVENT_TO_DELIVERED.labels(channel).observe(seconds)
    return outcomes


def keyword(item: Keyword) -> list[str]:
    """Apply an inbound STOP/START/HELP; the recipients it touched."""
    with engine().begin() as conn:
        users = ledger.apply_keyword(conn, item, now=clock.now())
    log.info(
        "inbound keyword",
        extra={"action": f"keyword_{item.keyword}", "channel": item.channel, "users": len(users)},
    )
    return users


def replay_early() -> int:
    """Receipts that beat their send's record (the tick calls this)."""
    with engine().begin() as conn:
        return ledger.replay_early(conn, now=clock.now(), category_of=category_of)
