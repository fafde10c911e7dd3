"""Collapse: requests with the same collapse key inside a window become one notification. The
first leads the group (a claim in PostgreSQL); the others follow it and are counted on it."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection

from clarion.catalog import NotificationType
from clarion.db import collapse_groups
from clarion.gates.contract import (
    Channels,
    ClaimContext,
    Context,
    FunctionClaim,
    FunctionGate,
    Plan,
    Snapshot,
    with_step,
)
from clarion.rows import CollapseGroup, PlannedRequest, evolve


def plan(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    request, ntype, snapshot, now = c.request, c.ntype, c.snapshot, c.now
    key = ntype.collapse_key(request.variables)
    spec = ntype.gate_options.collapse
    if key is None or spec is None:
        return p, channels
    if (follows := open_group(request, ntype, snapshot, now)) is not None:
        return collapsed(p, follows), []
    until = now + timedelta(seconds=spec.window_seconds)
    return evolve(
        with_step(p, "collapse", "allow", "leads_group", f"key {key!r} until {until.isoformat()}"),
        collapse=(key, until),
    ), channels


def open_group(
    request: PlannedRequest, ntype: NotificationType, snapshot: Snapshot, now: datetime
) -> CollapseGroup | None:
    """The open collapse group this request would follow, or None."""
    key = ntype.collapse_key(request.variables)
    group = snapshot.collapses.get(key) if key is not None else None
    if group is None or group.until <= now or group.leader_id == request.id:
        return None
    return group


def collapsed(p: Plan, group: CollapseGroup, *, joining: int = 1) -> Plan:
    """The plan for a follower of `group`: counted on it (`joining`: the members it will have
    gained, this request included, when the follower joins it)."""
    key = group.key
    detail = (
        f"collapsed into request {group.leader_id} (key {key!r}, {group.count + joining} so far, "
        f"window until {group.until.isoformat()})"
    )
    return evolve(
        with_step(p, "collapse", "collapse", "collapsed", detail),
        collapse=None,
        caps=(),
        window_until=None,
        channels=(),
        join_collapse=key,
    )


def claim(conn: Connection, p: Plan, c: ClaimContext) -> Plan:
    """Lead the group the plan asks for; a leader another worker made first makes a follower."""
    if p.collapse is None:
        return p
    key, until = p.collapse
    r = c.request
    group = collapse_groups.claim_collapse(
        conn, r.user_id, key=key, request_id=r.id, now=c.now, until=until
    )
    return p if group.leader_id == r.id else collapsed(p, group, joining=0)


GATE = FunctionGate("collapse", plan)
CLAIM = FunctionClaim("collapse", claim, lambda p: p.collapse is not None)
