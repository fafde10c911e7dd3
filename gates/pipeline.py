"""The planner: ordered gates over a snapshot of one recipient, returning a Plan. No side effects.

Order: (resolve-once happens before planning, in the route task's conditional update)
  per channel:  reachability → suppression list → preferences → one platform
  per request:  digest → quiet hours → marketing SMS hours → activation window → fatigue caps
                → collapse

A digested type stops at `digest`: its request joins a window, and the digest request made of the
window goes through every gate itself (quiet hours, the window, caps apply to the digest, once).

Gates that need an atomic claim (window, caps, collapse) plan the claim here; `gates.apply`
makes it in PostgreSQL and, if another worker won the race since the snapshot, turns the plan
into the same outcome the gate would have chosen had it seen that worker's row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, time, timedelta
from typing import Protocol

from clarion.catalog import NotificationType
from clarion.catalog.model import Policy
from clarion.gates import preferences
from clarion.gates.quiet import outside_hours_until, parse_time, quiet_until
from clarion.rows import PlannedRequest, Recipient
from clarion.scheduling.digests import window_due
from clarion.scheduling.zones import country_of, load_zone

NOT_CAPPED = frozenset({"transactional", "security"})


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
    preferences: tuple[preferences.Preference, ...] = ()
    suppressed: Mapping[tuple[str, str], str] = field(
        default_factory=dict
    )  # (channel, address) -> reason
    window: tuple[datetime, str] | None = None  # (until, type that opened it)
    counters: Mapping[tuple[str, str], int] = field(
        default_factory=dict
    )  # (scope, bucket) -> count
    collapses: Mapping[str, tuple[int, datetime, int]] = field(
        default_factory=dict
    )  # key -> (leader, until, n)


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


@dataclass
class _Builder:
    steps: list[Step] = field(default_factory=list)

    def add(
        self,
        gate: str,
        outcome: str,
        reason: str,
        detail: str = "",
        channel: str | None = None,
        until: datetime | None = None,
    ) -> None:
        self.steps.append(Step(gate, outcome, reason, detail, channel, until))


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
    b = _Builder()
    recipient = snapshot.recipient
    if ntype is None:
        b.add(
            "catalog",
            "suppress",
            "unknown_type",
            f"type {request.type_key!r} is not in the catalog",
        )
        return Plan(tuple(b.steps))
    if recipient is None:
        b.add("recipient", "suppress", "unknown_recipient")
        return Plan(tuple(b.steps))
    channels = _channel_gates(b, ntype, recipient, snapshot, needs_address)
    if not channels:
        return Plan(tuple(b.steps))
    result = Plan(tuple(b.steps), on_window=ntype.gate_options.on_window)
    if ntype.digest is not None:
        return digested(result, ntype, request, recipient, now)
    context = Context(request, ntype, recipient, snapshot, now, policy)
    for gate in GATES:
        result, channels = gate.plan(result, channels, context)
        if not channels or result.defer_until is not None:
            return replace(result, channels=())
    return replace(result, channels=tuple(channels))


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
    return replace(
        with_step(p, "digest", "digest", "digested", detail),
        digest=DigestJoin(spec.type, key, due, spec.max_items),
        channels=(),
    )


def suppressed(channel: str, address: str, listed: Mapping[tuple[str, str], str]) -> str | None:
    """The suppression reason that stops `address` on `channel`, or None. A push address is a
    list of devices: it is stopped only when every device is listed."""
    if channel == "push":
        reasons = [listed.get((channel, device)) for device in address.split()]
        return None if not reasons or None in reasons else reasons[0]
    return listed.get((channel, address))


def _channel_gates(
    b: _Builder,
    ntype: NotificationType,
    recipient: Recipient,
    snapshot: Snapshot,
    needs_address: Mapping[str, bool],
) -> list[tuple[str, datetime | None]]:
    addresses = recipient.addresses or {}
    country = country_of(recipient.country, recipient.timezone)
    chosen: list[tuple[str, datetime | None]] = []
    for channel in ntype.channels:
        address = addresses.get(channel) or recipient.user_id
        if channel not in needs_address:
            b.add(
                "channel", "suppress", "no_adapter", f"no adapter for channel {channel!r}", channel
            )
        elif needs_address[channel] and not addresses.get(channel):
            b.add(
                "channel", "suppress", "no_address", f"recipient has no {channel} address", channel
            )
        elif (why := suppressed(channel, address, snapshot.suppressed)) is not None:
            b.add(
                "suppression",
                "suppress",
                "suppressed_address",
                f"{channel} address is on the suppression list ({why})",
                channel,
            )
        elif not (
            pref := preferences.resolve(ntype, channel, snapshot.preferences, country)
        ).enabled:
            b.add("preferences", "suppress", "opted_out", pref.source, channel)
        elif ntype.one_platform and chosen:
            b.add(
                "one_platform",
                "suppress",
                "other_platform",
                f"sent on {chosen[0][0]} instead",
                channel,
            )
        else:
            b.add("preferences", "allow", "allowed", pref.source, channel)
            chosen.append((channel, None))
    if not chosen:
        b.add("channels", "suppress", "no_channel", "no channel is left to send on")
    return chosen


def _quiet_hours(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
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
    return replace(
        with_step(p, "quiet_hours", "defer", "quiet_hours", detail, until=until), defer_until=until
    ), channels


def _marketing_sms_hours(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
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


def _activation_window(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    ntype, snapshot, now, policy = c.ntype, c.snapshot, c.now, c.policy
    if ntype.category != "activation":
        return p, channels
    if ntype.window_exempt:
        return with_step(p, "activation_window", "allow", "exempt", "window-exempt type"), channels
    if snapshot.window is not None and snapshot.window[0] > now:
        return blocked_by_window(p, snapshot.window), []
    until = now + timedelta(hours=policy.activation_window_hours)
    return replace(
        with_step(p, "activation_window", "allow", "opens_window", f"until {until.isoformat()}"),
        window_until=until,
    ), channels


def blocked_by_window(p: Plan, window: tuple[datetime, str]) -> Plan:
    """The plan for a nudge that meets an open window: skipped, or deferred to its end (per type)."""
    until, opener = window
    detail = f"another activation nudge ({opener}) holds the window until {until.isoformat()}"
    if p.on_window == "defer":
        return replace(
            with_step(p, "activation_window", "defer", "activation_window", detail, until=until),
            defer_until=until,
            window_until=None,
            caps=(),
            collapse=None,
            channels=(),
        )
    return replace(
        with_step(p, "activation_window", "suppress", "activation_window", detail),
        window_until=None,
        caps=(),
        collapse=None,
        channels=(),
    )


def cap_buckets(recipient: Recipient, now: datetime) -> list[tuple[str, str, datetime]]:
    """(scope, bucket, bucket end) for the recipient's local day and their organisation's hour."""
    local = now.astimezone(load_zone(recipient.timezone))
    day_end = datetime.combine(local.date() + timedelta(days=1), time(0), tzinfo=local.tzinfo)
    buckets = [(f"user:{recipient.user_id}", local.date().isoformat(), day_end)]
    if recipient.org_id:
        hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        buckets.append(
            (f"org:{recipient.org_id}", hour.strftime("%Y-%m-%dT%H"), hour + timedelta(hours=1))
        )
    return buckets


def _fatigue_caps(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    request, ntype, snapshot, now, policy = c.request, c.ntype, c.snapshot, c.now, c.policy
    if ntype.category in NOT_CAPPED or ntype.critical or ntype.key == policy.summary_type:
        return p, channels
    if _open_group(request, ntype, snapshot, now) is not None:
        return p, channels  # a follower adds no notification: it is counted on its leader
    limits = {"user": policy.per_user_per_day, "org": policy.per_org_per_hour}
    claims = []
    for scope, bucket, ends in cap_buckets(c.recipient, now):
        limit = limits[scope.split(":")[0]]
        if limit is None:
            continue
        if snapshot.counters.get((scope, bucket), 0) >= limit:
            return folded(p, c.recipient, now, policy, f"{scope} reached {limit} in {bucket}"), []
        claims.append(CapClaim(scope, bucket, limit, ends))
    if not claims:
        return p, channels
    return replace(with_step(p, "fatigue_cap", "allow", "under_cap"), caps=tuple(claims)), channels


def folded(p: Plan, recipient: Recipient, now: datetime, policy: Policy, detail: str) -> Plan:
    """The plan for a request over a fatigue cap: folded into the day's summary, or dropped."""
    if policy.summary_type is None:
        return replace(
            with_step(p, "fatigue_cap", "suppress", "fatigue_cap", detail + "; no summary type"),
            caps=(),
            window_until=None,
            channels=(),
        )
    scope, bucket, ends = cap_buckets(recipient, now)[0]
    fold = Fold(policy.summary_type, f"summary:{bucket}", ends)
    detail += f"; folded into the {bucket} summary"
    return replace(
        with_step(p, "fatigue_cap", "fold", "fatigue_cap", detail),
        caps=(),
        fold=fold,
        window_until=None,
        channels=(),
    )


def _open_group(
    request: PlannedRequest, ntype: NotificationType, snapshot: Snapshot, now: datetime
) -> tuple[str, tuple[int, datetime, int]] | None:
    """(key, group) of the open collapse group this request would follow, or None."""
    key = ntype.collapse_key(request.variables)
    group = snapshot.collapses.get(key) if key is not None else None
    if key is None or group is None or group[1] <= now or group[0] == request.id:
        return None
    return key, group


def _collapse(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    request, ntype, snapshot, now = c.request, c.ntype, c.snapshot, c.now
    key = ntype.collapse_key(request.variables)
    spec = ntype.gate_options.collapse
    if key is None or spec is None:
        return p, channels
    seconds = spec.window_seconds
    if (follows := _open_group(request, ntype, snapshot, now)) is not None:
        return collapsed(p, *follows), []
    until = now + timedelta(seconds=seconds)
    return replace(
        with_step(p, "collapse", "allow", "leads_group", f"key {key!r} until {until.isoformat()}"),
        collapse=(key, until),
    ), channels


def collapsed(p: Plan, key: str, group: tuple[int, datetime, int]) -> Plan:
    leader, until, count = group
    detail = f"collapsed into request {leader} (key {key!r}, {count + 1} so far, window until {until.isoformat()})"
    return replace(
        with_step(p, "collapse", "collapse", "collapsed", detail),
        collapse=None,
        caps=(),
        window_until=None,
        channels=(),
        join_collapse=key,
    )


def with_step(
    p: Plan,
    gate: str,
    outcome: str,
    reason: str,
    detail: str = "",
    channel: str | None = None,
    until: datetime | None = None,
) -> Plan:
    return replace(p, steps=p.steps + (Step(gate, outcome, reason, detail, channel, until),))


# The per-request gates, in order. Adding one: a module with a `Gate` and one `register(...)` line.
GATES: list[Gate] = [
    FunctionGate("quiet_hours", _quiet_hours),
    FunctionGate("sms_hours", _marketing_sms_hours),
    FunctionGate("activation_window", _activation_window),
    FunctionGate("fatigue_cap", _fatigue_caps),
    FunctionGate("collapse", _collapse),
]


def register(gate: Gate, *, before: str | None = None) -> None:
    """Add a gate to the pipeline: last, or just before the gate named `before`."""
    names = [g.name for g in GATES]
    if gate.name in names:
        raise ValueError(f"a gate named {gate.name!r} is already registered")
    GATES.insert(names.index(before) if before is not None else len(GATES), gate)


def unregister(name: str) -> None:
    """Take the gate named `name` out of the pipeline (a test's own gate, after the test)."""
    GATES[:] = [g for g in GATES if g.name != name]
