"""Evolve a snapshot in memory as if a plan had been applied: for simulations on a virtual clock.

The real path makes these changes with atomic claims in PostgreSQL (gates.apply); here one
recipient's timeline is replayed in order, so there is no race to lose.
"""

from __future__ import annotations

from dataclasses import replace

from clarion.gates.contract import Plan, Snapshot
from clarion.rows import CollapseGroup, OpenWindow, PlannedRequest


def applied(snapshot: Snapshot, plan: Plan, request: PlannedRequest) -> Snapshot:
    """The snapshot after `plan` went through (window opened, caps counted, collapse led)."""
    if plan.outcome != "deliver":
        return snapshot
    window = snapshot.window
    if plan.window_until is not None:
        window = OpenWindow(request.user_id, plan.window_until, request.type_key)
    counters = dict(snapshot.counters)
    for cap in plan.caps:
        counters[(cap.scope, cap.bucket)] = counters.get((cap.scope, cap.bucket), 0) + 1
    collapses = dict(snapshot.collapses)
    if plan.collapse is not None:
        key, until = plan.collapse
        # a simulated request always has an id
        collapses[key] = CollapseGroup(request.user_id, key, request.id or 0, until, 1)
    return replace(snapshot, window=window, counters=counters, collapses=collapses)
