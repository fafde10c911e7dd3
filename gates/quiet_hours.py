"""Quiet hours: a request met inside the recipient's quiet window is deferred to its end; critical
types and the policy's bypass categories go through (gates/quiet.py does the local-time sums)."""

from __future__ import annotations

from clarion.gates.contract import Channels, Context, FunctionGate, Plan, with_step
from clarion.gates.quiet import quiet_until
from clarion.rows import evolve


def plan(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    ntype, now, policy = c.ntype, c.now, c.policy
    r = c.recipient
    if ntype.critical or ntype.category in policy.quiet_hours_bypass:
        return with_step(
            p, "quiet_hours", "allow", "bypass", f"{ntype.category} bypasses quiet hours"
        ), channels
    until = quiet_until(r.quiet_start, r.quiet_end, r.timezone, now)
    if until is None:
        return with_step(p, "quiet_hours", "allow", "outside_quiet_hours"), channels
    detail = f"quiet hours in {r.timezone} until {until.isoformat()}"
    return evolve(
        with_step(p, "quiet_hours", "defer", "quiet_hours", detail, until=until), defer_until=until
    ), channels


GATE = FunctionGate("quiet_hours", plan)
