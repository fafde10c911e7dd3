"""The planner: ordered gates over a snapshot of one recipient, returning a Plan. No side effects.

Order: (resolve-once happens before planning, in the route task's conditional update)
  per channel:  reachability → suppression list → preferences → one platform   (CHANNEL_GATES)
  per request:  digest → quiet hours → marketing SMS hours → activation window → fatigue caps
                → collapse                                                     (GATES)

A digested type stops at `digest`: its request joins a window, and the digest request made of the
window goes through every gate itself (quiet hours, the window, caps apply to the digest, once).

The channel gates and the per-request gates are two lists with two small protocols
(gates/contract.py): a channel gate answers for one channel before any request-wide decision, a
per-request gate sees the channels still open. Each gate is one module beside this one.

Gates that need an atomic claim (window, caps, collapse) plan the claim here; gates.apply
makes the claims in CLAIMS order and, if another worker won the race since the snapshot, turns
the plan into the same outcome the gate would have chosen had it seen that worker's row.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TypeVar

from clarion.catalog import NotificationType
from clarion.catalog.model import Policy
from clarion.gates import (
    activation_window,
    collapse,
    digest,
    fatigue_caps,
    marketing_hours,
    one_platform,
    opt_out,
    quiet_hours,
    reachability,
    suppression,
)
from clarion.gates.contract import (
    ChannelContext,
    ChannelGate,
    Channels,
    Claim,
    Context,
    Gate,
    Plan,
    Snapshot,
    SnapshotPart,
    Step,
)
from clarion.rows import PlannedRequest, Recipient, evolve
from clarion.scheduling.zones import country_of

_Named = TypeVar("_Named", Gate, Claim, SnapshotPart[object])

# The channel gates, in order, for each of the type's channels.
CHANNEL_GATES: list[ChannelGate] = [
    reachability.GATE,
    suppression.GATE,
    opt_out.GATE,
    one_platform.GATE,
]

# The per-request gates, in order. Adding one: a module with a `Gate` and one `register(...)` line.
GATES: list[Gate] = [
    digest.GATE,
    quiet_hours.GATE,
    marketing_hours.GATE,
    activation_window.GATE,
    fatigue_caps.GATE,
    collapse.GATE,
]

# The claims, in the order gates.apply makes them: not the planning order. A request that finds a
# collapse leader (one routed in this same batch, say) is a follower and must spend no cap, so
# collapse claims before caps; a leader that then finds the cap spent is folded, and the route's
# savepoint takes its leadership back. The window comes first: a nudge it blocks claims nothing.
CLAIMS: list[Claim] = [activation_window.CLAIM, collapse.CLAIM, fatigue_caps.CLAIM]

# The registered gates' own snapshot queries (gates.apply.snapshots reads them with the rest). The
# built-in gates' rows are Snapshot fields instead: gates.simulate evolves them on a virtual clock.
PARTS: list[SnapshotPart[object]] = []


def plan(
    request: PlannedRequest,
    ntype: NotificationType | None,
    snapshot: Snapshot,
    *,
    now: datetime,
    policy: Policy,
    needs_address: Mapping[str, bool],
) -> Plan:
    """Decide where one request goes, or why it does not, without changing anything."""
    recipient = snapshot.recipient
    if ntype is None:
        detail = f"type {request.type_key!r} is not in the catalog"
        return Plan((Step("catalog", "suppress", "unknown_type", detail),))
    if recipient is None:
        return Plan((Step("recipient", "suppress", "unknown_recipient"),))
    steps, channels = channel_gates(ntype, recipient, snapshot, needs_address)
    if not channels:
        return Plan(steps)
    result = Plan(steps, on_window=ntype.gate_options.on_window)
    context = Context(request, ntype, recipient, snapshot, now, policy)
    for gate in GATES:
        result, channels = gate.plan(result, channels, context)
        if not channels or result.defer_until is not None:
            return evolve(result, channels=())
    return evolve(result, channels=tuple(channels))


def channel_gates(
    ntype: NotificationType,
    recipient: Recipient,
    snapshot: Snapshot,
    needs_address: Mapping[str, bool],
) -> tuple[tuple[Step, ...], Channels]:
    """Every channel of the type through CHANNEL_GATES: the steps, and the channels left."""
    c = ChannelContext(
        ntype, recipient, snapshot, needs_address, country_of(recipient.country, recipient.timezone)
    )
    steps: list[Step] = []
    for channel in ntype.channels:
        step = _one_channel(channel, c)
        steps.append(step)
        if step.outcome == "allow":
            c = evolve(c, chosen=(*c.chosen, channel))
    if not c.chosen:
        steps.append(Step("channels", "suppress", "no_channel", "no channel is left to send on"))
    return tuple(steps), [(channel, None) for channel in c.chosen]


def _one_channel(channel: str, c: ChannelContext) -> Step:
    """The step recorded for `channel`: the first gate's suppress, else the last allow."""
    allowed = Step("channels", "allow", "allowed", "", channel)
    for gate in CHANNEL_GATES:
        step = gate.check(channel, c)
        if step is not None and step.outcome != "allow":
            return step
        allowed = step or allowed
    return allowed


def register(
    gate: Gate,
    *,
    before: str | None = None,
    claim: Claim | None = None,
    claim_before: str | None = None,
    snapshot: SnapshotPart[object] | None = None,
) -> None:
    """Add a gate to the pipeline: last, or just before the gate named `before`; with its
    `claim`, if it has one, in CLAIMS (last, or just before the claim named `claim_before`); and
    its own `snapshot` query, if it reads rows of its own (its share: `Snapshot.part`)."""
    _free(GATES, gate)  # all or nothing: refuse a taken name before inserting any
    _free(CLAIMS, claim)
    _free(PARTS, snapshot)
    _insert(GATES, gate, before)
    if claim is not None:
        _insert(CLAIMS, claim, claim_before)
    if snapshot is not None:
        _insert(PARTS, snapshot, None)


def unregister(name: str) -> None:
    """Take the gate named `name` (its claim and snapshot query too) out of the pipeline (a
    test's own gate)."""
    GATES[:] = [g for g in GATES if g.name != name]
    CLAIMS[:] = [c for c in CLAIMS if c.name != name]
    PARTS[:] = [p for p in PARTS if p.name != name]


def _free(ordered: list[_Named], entry: _Named | None) -> None:
    if entry is not None and entry.name in [e.name for e in ordered]:
        raise ValueError(f"a gate named {entry.name!r} is already registered")


def _insert(ordered: list[_Named], entry: _Named, before: str | None) -> None:
    names = [e.name for e in ordered]
    ordered.insert(names.index(before) if before is not None else len(ordered), entry)
