"""The gate contract: the records a plan is made of, what a gate decides over, and the protocols.

A per-request gate is a `Gate`: a name and a pure `plan` step. A gate that must win a race in
PostgreSQL (the activation window, fatigue caps, collapse) names its claim on the `Plan` and is
also a `Claim`: gates.apply makes the claims in `pipeline.CLAIMS` order. A gate that reads rows of
its own has a `SnapshotPart`: gates.apply reads it for the whole batch with the snapshot (the
route and the dry run alike), and the gate finds its recipient's share with `Snapshot.part`. The
gates themselves are one module each beside this one; gates.pipeline holds the ordered lists and
the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar, cast

from sqlalchemy import Connection

from clarion.catalog import NotificationType
from clarion.catalog.model import Policy
from clarion.rows import (
    CollapseGroup,
    OpenWindow,
    PlannedRequest,
    Preference,
    Recipient,
    ResolvedRequest,
    evolve,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Step:
    """One gate's verdict: shown gate by gate by --dry-run and explain; non-allows are recorded."""

    gate: str
    outcome: str  # allow | suppress | defer | fold | collapse | digest
    reason: str
    detail: str = ""
    channel: str | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class Snapshot:
    """What the gates may look at for one recipient, read in one go."""

    recipient: Recipient | None
    preferences: tuple[Preference, ...] = ()
    # (channel, address) -> reason
    suppressed: Mapping[tuple[str, str], str] = field(default_factory=dict)
    window: OpenWindow | None = None
    # (scope, bucket) -> count
    counters: Mapping[tuple[str, str], int] = field(default_factory=dict)
    collapses: Mapping[str, CollapseGroup] = field(default_factory=dict)  # by collapse key
    # a registered gate's own rows for this recipient, by its SnapshotPart's name
    parts: Mapping[str, object] = field(default_factory=dict)

    def part(self, reader: SnapshotPart[T]) -> T | None:
        """This recipient's share of `reader`'s rows (None: it read nothing for them)."""
        return cast("T | None", self.parts.get(reader.name))


class SnapshotPart(Protocol[T_co]):
    """A gate's own snapshot query: `read` runs once per batch, inside the snapshot's
    transaction, and returns each recipient's share by user id (a recipient with nothing may be
    absent). Its `name` keys the share in `Snapshot.parts`."""

    @property
    def name(self) -> str: ...

    def read(
        self, conn: Connection, recipients: Mapping[str, Recipient], now: datetime
    ) -> Mapping[str, T_co]: ...


@dataclass(frozen=True)
class CapClaim:
    scope: str
    bucket: str
    limit: int
    expires_at: datetime


@dataclass(frozen=True)
class Fold:
    """Fold this request into the recipient's summary for the bucket."""

    summary_type: str
    occurrence_key: str
    due_at: datetime


@dataclass(frozen=True)
class DigestJoin:
    """Buffer this request into the recipient's open window of `digest_type` (or open one)."""

    digest_type: str
    key: str
    due_at: datetime  # when a window opened now would close
    max_items: int


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...] = ()
    channels: tuple[tuple[str, datetime | None], ...] = ()  # (channel, not before)
    defer_until: datetime | None = None
    window_until: datetime | None = None  # claim the activation window until then
    caps: tuple[CapClaim, ...] = ()
    fold: Fold | None = None
    collapse: tuple[str, datetime] | None = None  # claim leadership of (key, until)
    join_collapse: str | None = None  # count this request on the open group with that key
    digest: DigestJoin | None = None
    on_window: str = "skip"
    asks: frozenset[str] = frozenset()  # registered claims (by name) gates.apply must make

    @property
    def outcome(self) -> str:
        if self.channels:
            return "deliver"
        for step in reversed(self.steps):
            if step.outcome != "allow" and step.channel is None:
                return step.outcome
        return "suppress"

    @property
    def decisions(self) -> tuple[Step, ...]:
        """The steps to record: every one that was not an allow."""
        return tuple(s for s in self.steps if s.outcome != "allow")


Channels = list[tuple[str, datetime | None]]  # (channel, not before) still open


@dataclass(frozen=True)
class Context:
    """What a per-request gate decides over: the request, its type, a known recipient, the
    recipient's snapshot, the time and the catalog's policy."""

    request: PlannedRequest
    ntype: NotificationType
    recipient: Recipient
    snapshot: Snapshot
    now: datetime
    policy: Policy


class Gate(Protocol):
    """One per-request gate: a name (recorded on its steps) and a pure `plan` step that returns
    the plan with its step added and the channels still open (none, or a defer, stops the run).
    A gate that needs more rows, or an atomic claim, reads them through `Snapshot` and names the
    claim on the `Plan`; gates.apply makes it (see the module docstring)."""

    @property
    def name(self) -> str: ...

    def plan(self, p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]: ...


@dataclass(frozen=True)
class FunctionGate:
    """A gate made of a plan function."""

    name: str
    step: Callable[[Plan, Channels, Context], tuple[Plan, Channels]]

    def plan(self, p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
        return self.step(p, channels, c)


def with_step(
    p: Plan,
    gate: str,
    outcome: str,
    reason: str,
    detail: str = "",
    channel: str | None = None,
    until: datetime | None = None,
) -> Plan:
    return evolve(p, steps=p.steps + (Step(gate, outcome, reason, detail, channel, until),))


@dataclass(frozen=True)
class ClaimContext:
    """What a claim needs besides its connection and plan: the recipient's snapshot (the one the
    plan was made over), the catalog's policy and the time."""

    request: ResolvedRequest
    snapshot: Snapshot
    policy: Policy
    now: datetime


class Claim(Protocol):
    """The atomic half of a gate: make the plan's claim in PostgreSQL, inside the route's
    savepoint. Returns the plan unchanged when the claim holds; when another worker won since
    the snapshot, the plan the gate would have made had it seen that worker's row."""

    @property
    def name(self) -> str: ...

    def needed(self, p: Plan) -> bool:
        """Whether the plan asks for this claim: gates.apply opens its savepoint only then."""
        ...

    def claim(self, conn: Connection, p: Plan, c: ClaimContext) -> Plan: ...


def asked(p: Plan, claim: str) -> Plan:
    """The plan, asking gates.apply to make the registered claim named `claim`."""
    return evolve(p, asks=p.asks | {claim})


@dataclass(frozen=True)
class FunctionClaim:
    """A claim made of a function. `wanted` says whether a plan asks for it; by default, whether
    the plan names it in `asks` (what a registered gate's plan step sets with `asked`)."""

    name: str
    step: Callable[[Connection, Plan, ClaimContext], Plan]
    wanted: Callable[[Plan], bool] | None = None

    def needed(self, p: Plan) -> bool:
        return self.wanted(p) if self.wanted is not None else self.name in p.asks

    def claim(self, conn: Connection, p: Plan, c: ClaimContext) -> Plan:
        return self.step(conn, p, c)


@dataclass(frozen=True)
class ChannelContext:
    """What a channel gate decides over: the type, a known recipient, their snapshot, which
    channels have an adapter (and whether it needs an address), the recipient's country and the
    channels already chosen for this request."""

    ntype: NotificationType
    recipient: Recipient
    snapshot: Snapshot
    needs_address: Mapping[str, bool]
    country: str | None
    chosen: tuple[str, ...] = ()


class ChannelGate(Protocol):
    """One per-channel gate: `check` returns a suppress step (the channel is dropped, later gates
    do not run for it), an allow step (kept as the channel's recorded reason unless a later gate
    drops it), or None (no opinion)."""

    @property
    def name(self) -> str: ...

    def check(self, channel: str, c: ChannelContext) -> Step | None: ...


@dataclass(frozen=True)
class FunctionChannelGate:
    """A channel gate made of a check function."""

    name: str
    step: Callable[[str, ChannelContext], Step | None]

    def check(self, channel: str, c: ChannelContext) -> Step | None:
        return self.step(channel, c)
