"""Digest: a request of a digested type stops here and joins the recipient's open window of the
digest type (gates.apply names the digest request); the digest request made of the window goes
through every gate itself, once."""

from __future__ import annotations

from datetime import datetime

from clarion.catalog import NotificationType
from clarion.gates.contract import Channels, Context, DigestJoin, FunctionGate, Plan, with_step
from clarion.rows import PlannedRequest, Recipient, evolve
from clarion.scheduling.digests import window_due


def digested(
    p: Plan,
    ntype: NotificationType,
    request: PlannedRequest,
    recipient: Recipient,
    now: datetime,
) -> Plan:
    """The plan for a request of a digested type: join the window (gates.apply names its request)."""
    spec = ntype.digest
    assert spec is not None
    key = ntype.digest_key(request.variables)
    due = window_due(now, recipient.timezone, every=spec.every, daily=spec.daily)
    detail = f"into the open {spec.type} digest (key {key!r}), or one closing {due.isoformat()}"
    return evolve(
        with_step(p, "digest", "digest", "digested", detail),
        digest=DigestJoin(spec.type, key, due, spec.max_items),
        channels=(),
    )


def plan(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    """First of the per-request gates: a digested type goes no further (the digest does)."""
    if c.ntype.digest is None:
        return p, channels
    return digested(p, c.ntype, c.request, c.recipient, c.now), []


GATE = FunctionGate("digest", plan)
