"""Marketing SMS hours: a marketing text waits for the policy's local sending hours; the request's
other channels are not held."""

from __future__ import annotations

from clarion.gates.contract import Channels, Context, FunctionGate, Plan, with_step
from clarion.gates.quiet import outside_hours_until, parse_time


def plan(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    ntype, now, policy = c.ntype, c.now, c.policy
    if ntype.category != "marketing" or not any(c == "sms" for c, _ in channels):
        return p, channels
    opens, closes = (parse_time(t) for t in policy.marketing_sms_hours)
    until = outside_hours_until(opens, closes, c.recipient.timezone, now)
    if until is None:
        return p, channels
    detail = (
        f"marketing SMS only {opens:%H:%M}–{closes:%H:%M} local; held until {until.isoformat()}"
    )
    p = with_step(
        p, "sms_hours", "defer", "marketing_sms_hours", detail, channel="sms", until=until
    )
    return p, [(c, until if c == "sms" else nb) for c, nb in channels]


GATE = FunctionGate("sms_hours", plan)
