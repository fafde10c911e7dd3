"""The activation window: one activation nudge per recipient per window. The first opens it (a
claim in PostgreSQL); a nudge that meets an open window is skipped, or deferred to its end."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection

from clarion.db import activation_windows
from clarion.gates.contract import (
    Channels,
    ClaimContext,
    Context,
    FunctionClaim,
    FunctionGate,
    Plan,
    with_step,
)
from clarion.rows import OpenWindow, evolve


def plan(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    ntype, snapshot, now, policy = c.ntype, c.snapshot, c.now, c.policy
    if ntype.category != "activation":
        return p, channels
    if ntype.window_exempt:
        return with_step(p, "activation_window", "allow", "exempt", "window-exempt type"), channels
    if snapshot.window is not None and snapshot.window.until > now:
        return blocked_by_window(p, snapshot.window), []
    until = now + timedelta(hours=policy.activation_window_hours)
    return evolve(
        with_step(p, "activation_window", "allow", "opens_window", f"until {until.isoformat()}"),
        window_until=until,
    ), channels


def blocked_by_window(p: Plan, window: OpenWindow) -> Plan:
    """The plan for a nudge that meets an open window: skipped, or deferred to its end (per type)."""
    until = window.until
    detail = (
        f"another activation nudge ({window.type_key}) holds the window until {until.isoformat()}"
    )
    if p.on_window == "defer":
        return evolve(
            with_step(p, "activation_window", "defer", "activation_window", detail, until=until),
            defer_until=until,
            window_until=None,
            caps=(),
            collapse=None,
            channels=(),
        )
    return evolve(
        with_step(p, "activation_window", "suppress", "activation_window", detail),
        window_until=None,
        caps=(),
        collapse=None,
        channels=(),
    )


def claim(conn: Connection, p: Plan, c: ClaimContext) -> Plan:
    """Open the window the plan asks for; a window another worker opened first blocks the nudge."""
    if p.window_until is None:
        return p
    r = c.request
    holder = activation_windows.claim_window(
        conn, r.user_id, request_id=r.id, type_key=r.type_key, now=c.now, until=p.window_until
    )
    return p if holder is None else blocked_by_window(p, holder)


GATE = FunctionGate("activation_window", plan)
CLAIM = FunctionClaim("activation_window", claim, lambda p: p.window_until is not None)
