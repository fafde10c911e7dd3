"""Fatigue caps: at most so many notifications per recipient per local day and per organisation
per hour (slots claimed in PostgreSQL); one over the cap is folded into the day's summary."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from functools import lru_cache

from sqlalchemy import Connection

from clarion.catalog.model import Policy
from clarion.db import fatigue_counters
from clarion.errors import ClarionError
from clarion.gates.collapse import open_group
from clarion.gates.contract import (
    CapClaim,
    Channels,
    ClaimContext,
    Context,
    Fold,
    FunctionClaim,
    FunctionGate,
    Plan,
    with_step,
)
from clarion.rows import Recipient, evolve
from clarion.scheduling.zones import load_zone

NOT_CAPPED = frozenset({"transactional", "security"})


def plan(p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
    request, ntype, snapshot, now, policy = c.request, c.ntype, c.snapshot, c.now, c.policy
    if ntype.category in NOT_CAPPED or ntype.critical or ntype.key == policy.summary_type:
        return p, channels
    if open_group(request, ntype, snapshot, now) is not None:
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
    return evolve(with_step(p, "fatigue_cap", "allow", "under_cap"), caps=tuple(claims)), channels


def cap_buckets(recipient: Recipient, now: datetime) -> list[tuple[str, str, datetime]]:
    """(scope, bucket, bucket end) for the recipient's local day and their organisation's hour."""
    buckets = [(f"user:{recipient.user_id}", *_local_day(recipient.timezone, now))]
    if recipient.org_id:
        buckets.append((f"org:{recipient.org_id}", *_hour(now)))
    return buckets


# A route batch shares one `now` and its recipients share a few zones: each bucket is worked
# out once per (zone, now) rather than once per request and again per snapshot.
@lru_cache(maxsize=512)
def _local_day(zone: str, now: datetime) -> tuple[str, datetime]:
    local = now.astimezone(load_zone(zone))
    return local.date().isoformat(), datetime.combine(
        local.date() + timedelta(days=1), time(0), tzinfo=local.tzinfo
    )


@lru_cache(maxsize=8)
def _hour(now: datetime) -> tuple[str, datetime]:
    hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return hour.strftime("%Y-%m-%dT%H"), hour + timedelta(hours=1)


def folded(p: Plan, recipient: Recipient, now: datetime, policy: Policy, detail: str) -> Plan:
    """The plan for a request over a fatigue cap: folded into the day's summary, or dropped."""
    if policy.summary_type is None:
        return evolve(
            with_step(p, "fatigue_cap", "suppress", "fatigue_cap", detail + "; no summary type"),
            caps=(),
            window_until=None,
            channels=(),
        )
    scope, bucket, ends = cap_buckets(recipient, now)[0]
    fold = Fold(policy.summary_type, f"summary:{bucket}", ends)
    detail += f"; folded into the {bucket} summary"
    return evolve(
        with_step(p, "fatigue_cap", "fold", "fatigue_cap", detail),
        caps=(),
        fold=fold,
        window_until=None,
        channels=(),
    )


def claim(conn: Connection, p: Plan, c: ClaimContext) -> Plan:
    """Take a slot under each cap the plan names; a cap spent since the snapshot folds it."""
    for cap in p.caps:
        if fatigue_counters.claim_cap(
            conn, scope=cap.scope, bucket=cap.bucket, limit=cap.limit, expires_at=cap.expires_at
        ):
            continue
        recipient = c.snapshot.recipient
        if recipient is None:  # gates.pipeline.plan gives caps to known recipients only
            raise ClarionError(f"a fatigue cap for unknown recipient {c.request.user_id!r}")
        detail = f"{cap.scope} reached {cap.limit} in {cap.bucket}"
        return folded(p, recipient, c.now, c.policy, detail)
    return p


GATE = FunctionGate("fatigue_cap", plan)
CLAIM = FunctionClaim("fatigue_cap", claim, lambda p: bool(p.caps))
