"""The deliver task (`clarion.deliver`) and the route task's way into the same send path.

The send sequence, its outcomes, group commit, retry policy and sender pool are tasks/send/;
this module only enters it with the process's settings and engine, and writes the batch's send
tallies to Redis once at its end (tasks.send.rate).
"""

from __future__ import annotations

from celery import shared_task

from clarion import settings
from clarion.db.engine import engine
from clarion.rows import ClaimedDelivery
from clarion.tasks.lanes import transactional_work
from clarion.tasks.send import rate, sequence


@shared_task(name="clarion.deliver")
def deliver(users: list[str], ids: list[int]) -> int:
    """Deliver a batch; returns the sends recorded. Rows another worker holds, or that are
    done, are skipped by the claim. On the transactional lane it is marked in flight, so the
    bulk lanes give way to it (tasks.lanes); called from a route task, the route's mark holds."""
    lane = (deliver.request.delivery_info or {}).get("routing_key")
    try:
        with transactional_work(lane):
            return sequence.claim_and_send(
                list(zip(users, ids, strict=True)), settings.get(), engine()
            )
    finally:
        rate.flush()  # the batch's outcomes, in one Redis round trip


def deliver_now(rows: list[tuple[str, int, str]]) -> None:
    """Deliver (user_id, id, lane) rows in this process, as the deliver task would (a budgeted
    lane's route task sends its own slice: tasks.lanes)."""
    if rows:
        deliver([r[0] for r in rows], [r[1] for r in rows])


def send_claimed(claimed: list[ClaimedDelivery], token: str) -> None:
    """Send rows this process claimed already under `token` (the route task inserts the rows
    it sends itself as claimed: ledger.insert_deliveries)."""
    if not claimed:
        return
    try:
        sequence.send_claimed(claimed, token, settings.get(), engine())
    finally:
        rate.flush()
