"""Dry runs: the same planner the route task uses, over the same snapshot, writing nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from clarion import clock
from clarion.db import ledger
from clarion.db.engine import engine
from clarion.errors import UnknownRecipient
from clarion.gates.apply import needs_address, snapshots
from clarion.gates.contract import Plan
from clarion.gates.pipeline import plan
from clarion.rows import DraftRequest
from clarion.tasks import runtime
from clarion.tasks.producer import build_request


def preview(
    user_id: str,
    type_key: str,
    *,
    event_id: str | None = None,
    occurrence_key: str | None = None,
    variables: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Plan:
    """What would happen to this notification now: the plan, gate by gate. Validates like notify()."""
    request = build_request(user_id, type_key, event_id, occurrence_key, variables)
    now = now or clock.now()
    with engine().connect() as conn:
        existing = ledger.find_request(conn, user_id, type_key, request.occurrence_key)
        draft = DraftRequest(user_id, existing, type_key, request.occurrence_key, request.variables)
        plans = plan_many(conn, [draft], now=now)
    if user_id not in plans:
        raise UnknownRecipient(user_id)
    return plans[user_id]


def plan_many(
    conn: Connection, drafts: Sequence[DraftRequest], *, now: datetime
) -> dict[str, Plan]:
    """The plans of requests for distinct recipients, by user id, over one snapshot read for all
    of them (a broadcast's dry run plans a chunk at a time). Unknown recipients are absent."""
    catalog = runtime.catalog()
    recipients = ledger.recipients(conn, [d.user_id for d in drafts])
    found = snapshots(conn, recipients, now=now)
    needs = needs_address(runtime.adapters().values())
    return {
        d.user_id: plan(
            d,
            catalog.get(d.type_key),
            found[d.user_id],
            now=now,
            policy=catalog.policy,
            needs_address=needs,
        )
        for d in drafts
        if d.user_id in recipients
    }
