"""The route task: resolve each request once, plan it through the gates, apply the plan."""

from __future__ import annotations

import logging
import random
import time
import uuid
from datetime import datetime, timedelta

from celery import shared_task
from psycopg.errors import DeadlockDetected
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from clarion import clock, faults, metrics, settings
from clarion.catalog import Catalog
from clarion.db import ledger
from clarion.db.engine import engine
from clarion.gates.apply import apply, needs_address, snapshots
from clarion.gates.contract import Snapshot
from clarion.gates.pipeline import plan
from clarion.rows import ClaimedDelivery, CreatedDelivery, Recipient, ResolvedRequest
from clarion.tasks import escalation, runtime
from clarion.tasks.deliver import deliver_now, send_claimed
from clarion.tasks.flush import close_windows
from clarion.tasks.lanes import paced, rate, transactional_work, wait_turn

log = logging.getLogger(__name__)


DEADLOCK_RETRIES = 3


@shared_task(name="clarion.route")
def route(users: list[str], ids: list[int]) -> int:
    """Route a batch of requests. A request already routed is skipped: re-publishing changes nothing.

    A lane with a budget (tasks.lanes: the queue the message came from) is routed in slices, each
    slice's deliveries published when the budget allows; a bulk lane's slices also give way to
    transactional work, which marks itself in flight while it runs (tasks.lanes.Pacer)."""
    keys = sorted(zip(users, ids, strict=True))  # one lock order for every batch
    lane = (route.request.delivery_info or {}).get("routing_key")
    with transactional_work(lane):
        return sum(_route_slice(part, lane) for part in paced(lane, keys))


def _route_slice(keys: list[tuple[str, int]], lane: str | None) -> int:
    for attempt in range(DEADLOCK_RETRIES + 1):
        try:
            return _route([u for u, _ in keys], [i for _, i in keys], lane=lane)
        except OperationalError as exc:
            # Two batches claiming shared rows (an organisation's cap counter) in opposite orders:
            # PostgreSQL aborts one; its transaction left nothing behind, so run it again.
            if not isinstance(exc.orig, DeadlockDetected) or attempt == DEADLOCK_RETRIES:
                raise
            log.info("route batch deadlocked; retrying", extra={"action": "route_deadlock_retry"})
            time.sleep(random.uniform(0.01, 0.1) * (attempt + 1))
    raise AssertionError("unreachable")


SKEW_RETRY = 10.0  # seconds before a request of a type this worker lacks is routed again


def _known_types(
    conn: Connection, requests: list[ResolvedRequest], catalog: Catalog, now: datetime
) -> list[ResolvedRequest]:
    """Requests whose type this worker's catalog lacks, if recent, go back to wait for a worker
    that has it (a rolling deploy: the producer runs a newer catalog); older than
    CLARION_CATALOG_SKEW_GRACE, they are planned, and the planner records `unknown_type`."""
    grace = timedelta(seconds=settings.get().catalog_skew_grace)
    waiting = [
        r for r in requests if catalog.get(r.type_key) is None and now - r.created_at < grace
    ]
    if not waiting:
        return requests
    ledger.unresolve_requests(
        conn, [r.key for r in waiting], due_at=now + timedelta(seconds=SKEW_RETRY)
    )
    log.info(
        "types not in this catalog yet",
        extra={
            "action": "route_type_unknown_here",
            "types": sorted({r.type_key for r in waiting}),
        },
    )
    skipped = {r.key for r in waiting}
    return [r for r in requests if r.key not in skipped]


def _route(users: list[str], ids: list[int], *, lane: str | None = None) -> int:
    now = clock.now()
    catalog = runtime.catalog()
    reachable = needs_address(runtime.adapters().values())
    deliveries: list[ledger.NewDelivery] = []
    decisions: list[ledger.Decision] = []
    with engine().begin() as conn:
        resolved = ledger.resolve_requests(conn, zip(users, ids, strict=True), now=now)
        if any(catalog.get(r.type_key) is None for r in resolved):
            catalog = runtime.catalog_now()  # a type added to the file since the last look
        resolved = close_windows(conn, resolved, catalog, now=now)  # a digest request's items
        requests = _known_types(conn, resolved, catalog, now)
        recipients = ledger.recipients(conn, (r.user_id for r in requests))
        snaps = snapshots(conn, recipients, now=now)
        for request in requests:
            ntype = catalog.get(request.type_key)
            snapshot = snaps.get(request.user_id) or Snapshot(None)
            planned = plan(
                request, ntype, snapshot, now=now, policy=catalog.policy, needs_address=reachable
            )
            final = apply(
                conn, request, ntype, planned, snapshot=snapshot, catalog=catalog, now=now
            )
            escalation.routed(conn, request, ntype, final, snapshot.recipient, catalog, now)
            decisions += [
                ledger.Decision(
                    request.user_id,
                    request.id,
                    s.gate,
                    s.outcome,
                    s.reason,
                    s.detail,
                    s.channel,
                )
                for s in final.decisions
            ]
            if ntype is None:  # planned as `unknown_type`: decisions only, never a channel
                continue
            deliveries += [
                ledger.NewDelivery(
                    request.user_id,
                    request.id,
                    request.type_key,
                    request.occurrence_key,
                    channel,
                    ntype.one_platform,
                    request.lane,
                    not_before,
                )
                for channel, not_before in final.channels
            ]
        faults.hit("route.before_commit")
        s = settings.get()
        # A lane without a budget sends what it routed at once, in this process: its deliveries
        # are written claimed by this task (no pending row for a deliver task to claim again).
        token = str(uuid.uuid4()) if rate(lane) is None else None
        created = ledger.insert_deliveries(
            conn,
            deliveries,
            now=now,
            due_at=now + timedelta(seconds=s.stray_after),
            claim=None if token is None else (token, s.claim_lease),
        )
        answered = time.monotonic()
        ledger.insert_decisions(conn, decisions, now=now)
    faults.hit("route.after_commit")
    metrics.count_decisions((d.gate, d.outcome, d.reason) for d in decisions)
    if token is not None:  # every row not held back was inserted claimed
        mine = [c for c in created if c.lease_left is not None]
        send_claimed(_claimed(mine, requests, recipients, answered), token)
    else:
        ready = [(c.user_id, c.id, c.lane) for c in created if not c.held]
        # A budgeted lane sends its slice here, once the budget allows: published, the deliveries
        # would queue behind the rest of the lane's route backlog. Committed: a process that dies
        # waiting or sending leaves them to the tick (due at stray_after) and the claim leases.
        wait_turn(lane, len(requests))
        deliver_now(ready)
    runtime.count("route_skipped_already_resolved", len(ids) - len(requests))
    log.debug(
        "routed",
        extra={
            "action": "requests_routed",
            "routed": len(requests),
            "deliveries": len(created),
            "decisions": len(decisions),
        },
    )
    return len(requests)


def _claimed(
    created: list[CreatedDelivery],
    requests: list[ResolvedRequest],
    recipients: dict[str, Recipient],
    answered: float,
) -> list[ClaimedDelivery]:
    """The deliveries this task inserted claimed, with what sending them needs."""
    by_key = {r.key: r for r in requests}
    out = [
        ClaimedDelivery.inserted(
            c, by_key[(c.user_id, c.request_id)], recipients[c.user_id], claimed_at=answered
        )
        for c in created
    ]
    return sorted(out, key=lambda r: r.key)
