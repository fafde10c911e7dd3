"""Dry runs: the same planner the route task uses, over the same snapshot, writing nothing."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

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
    catalog = runtime.catalog()
    with engine().connect() as conn:
        recipients = ledger.recipients(conn, [user_id])
        if user_id not in recipients:
            raise UnknownRecipient(user_id)
        snapshot = snapshots(conn, recipients, now=now)[user_id]
        existing = ledger.find_request(conn, user_id, type_key, request.occurrence_key)
    draft = DraftRequest(user_id, existing, type_key, request.occurrence_key, request.variables)
    return plan(
        draft,
        catalog.get(type_key),
        snapshot,
        now=now,
        policy=catalog.policy,
        needs_address=needs_address(runtime.adapters().values()),
    )
