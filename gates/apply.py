"""Apply a plan inside the route transaction: make its claims atomically, then defer or fold.

If a claim is lost to a concurrent worker, the plan becomes the outcome the gate would have chosen
had its snapshot included that worker's row; a savepoint undoes any claim made before the loss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from clarion import hashing, settings
from clarion.catalog import Catalog, NotificationType
from clarion.db import collapse_groups, digests, gating, inbox
from clarion.errors import ConfigurationError
from clarion.gates.contract import ClaimContext, DigestJoin, Fold, Plan, Snapshot, Step
from clarion.gates.fatigue_caps import cap_buckets
from clarion.gates.pipeline import CLAIMS, PARTS
from clarion.rows import CollapseGroup, Recipient, ResolvedRequest, evolve


def snapshots(
    conn: Connection, recipients: Mapping[str, Recipient], *, now: datetime
) -> dict[str, Snapshot]:
    """Snapshots for many recipients at once: six queries whatever their number, and one more
    for each registered gate's own SnapshotPart."""
    scopes = {
        user: [scope for scope, _, _ in cap_buckets(r, now)] for user, r in recipients.items()
    }
    by_hash = _address_hashes(recipients)
    rows = gating.snapshot_rows(
        conn,
        recipients,
        [s for each in scopes.values() for s in each],
        now=now,
        hashed={(channel, digest) for digest, held in by_hash.items() for _, _, channel in held},
    )
    suppressed: defaultdict[str, dict[tuple[str, str], str]] = defaultdict(dict)  # -> reason
    # by address for everyone, the earliest event first; then by user (rows hashed under a former
    # address secret still stop their own recipient)
    for h in rows.hashed_suppressions:
        for user, plain, _ in by_hash.get(h.address_hash, ()):
            why = suppression_reason(h.reason, h.detail, h.created_at, own=h.user_id == user)
            suppressed[user].setdefault((h.channel, plain), why)
    for s in rows.suppressions:
        suppressed[s.user_id].setdefault((s.channel, s.address), s.reason)
    collapses: defaultdict[str, dict[str, CollapseGroup]] = defaultdict(dict)
    for group in rows.collapses:
        collapses[group.user_id][group.key] = group
    windows = {w.user_id: w for w in rows.windows}
    counters: defaultdict[str, dict[tuple[str, str], int]] = defaultdict(dict)  # by scope
    for c in rows.counters:
        counters[c.scope][(c.scope, c.bucket)] = c.count
    parts = {part.name: part.read(conn, recipients, now) for part in PARTS}
    return {
        user: Snapshot(
            recipient,
            tuple(rows.preferences.get(user, ())),
            suppressed[user],
            windows.get(user),
            {k: n for scope in scopes[user] for k, n in counters.get(scope, {}).items()},
            collapses[user],
            {name: part[user] for name, part in parts.items() if user in part},
        )
        for user, recipient in recipients.items()
    }


def suppression_reason(reason: str, detail: str, at: datetime, *, own: bool) -> str:
    """What a suppressed_address decision names: the event, whose it was, when (`clarion explain`)."""
    whose = "this recipient" if own else "another recipient with this address"
    said = f": {detail}" if detail else ""
    return f"{reason} recorded for {whose} at {at.isoformat(timespec='seconds')}{said}"


def _address_hashes(
    recipients: Mapping[str, Recipient],
) -> dict[str, list[tuple[str, str, str]]]:
    """hash → (user, address, channel) for every address (every push device) of these recipients."""
    key = hashing.address_key(settings.get())
    found: defaultdict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for user, recipient in recipients.items():
        for channel, address in recipient.addresses.items():
            values = str(address).split() if channel == "push" else [str(address)]
            for value in values:
                found[hashing.hashed(key, channel, value)].append((user, value, channel))
    return found


def apply(
    conn: Connection,
    request: ResolvedRequest,
    ntype: NotificationType | None,
    plan: Plan,
    *,
    snapshot: Snapshot,
    catalog: Catalog,
    now: datetime,
) -> Plan:
    """Make the plan's claims; returns the plan that actually holds (the same one, unless a race was lost)."""
    key = (request.user_id, request.id)
    if any(claim.needed(plan) for claim in CLAIMS):
        savepoint = conn.begin_nested()
        final = _claim(conn, request, plan, snapshot, catalog, now)
        if final is plan:
            savepoint.commit()
        else:
            savepoint.rollback()
        plan = final
    if plan.defer_until is not None:
        gating.defer_request(conn, key, until=plan.defer_until)
    if plan.join_collapse is not None:
        spacing = ntype.collapse_update_seconds if ntype else 0.0
        collapse_groups.join_collapse(
            conn,
            request.user_id,
            key=plan.join_collapse,
            now=now,
            refresh_at=now + timedelta(seconds=spacing),  # the leader's message, updated in place
        )
        # the leader's in-app item counts it too, under the group row lock just taken
        inbox.fold_follower(conn, request.user_id, key=plan.join_collapse, now=now)
    if plan.fold is not None:
        _fold(conn, request, plan.fold, catalog, now)
    if plan.digest is not None:
        plan = _join_digest(conn, request, plan, plan.digest, catalog, now)
    return plan


def _join_digest(
    conn: Connection,
    request: ResolvedRequest,
    plan: Plan,
    join: DigestJoin,
    catalog: Catalog,
    now: datetime,
) -> Plan:
    """Buffer the request; its decision names the digest request it will be sent in."""
    target = catalog.get(join.digest_type)
    if target is None:  # Catalog.from_dict refuses this; a catalog built in Python may not
        raise ConfigurationError(f"digest type {join.digest_type!r} is not in the catalog")
    item = {
        **request.variables,
        "request_id": request.id,
        "type_key": request.type_key,
        "at": now.isoformat(),
    }
    joined = digests.join(
        conn,
        request.user_id,
        digest_type=target.key,
        digest_key=join.key,
        lane=target.lane,
        version=target.version,
        item=item,
        max_items=join.max_items,
        due_at=join.due_at,
        now=now,
    )
    closes = "now (max_items reached)" if joined.state == "full" else joined.due_at.isoformat()
    detail = (
        f"digested into request {joined.request_id} ({join.digest_type}, key {join.key!r}, "
        f"item {joined.count} of at most {join.max_items}, closes {closes})"
    )
    steps = tuple(
        Step(s.gate, s.outcome, s.reason, detail) if s.gate == "digest" else s for s in plan.steps
    )
    return evolve(plan, steps=steps)


def _fold(
    conn: Connection, request: ResolvedRequest, fold: Fold, catalog: Catalog, now: datetime
) -> None:
    summary = catalog.get(fold.summary_type)
    if summary is None:  # Catalog.from_dict refuses this; a catalog built in Python may not
        raise ConfigurationError(f"policy.fatigue.summary_type {fold.summary_type!r} is not a type")
    fields: dict[str, Any] = dict(
        summary_type=summary.key,
        lane=summary.lane,
        version=summary.version,
        folded_type=request.type_key,
        now=now,
    )
    folded = gating.fold_into_summary(
        conn, request.user_id, occurrence_key=fold.occurrence_key, due_at=fold.due_at, **fields
    )
    if (
        folded is None
    ):  # the bucket's summary has just been routed: count this one in a late summary
        gating.fold_into_summary(
            conn,
            request.user_id,
            occurrence_key=f"{fold.occurrence_key}+late",
            due_at=now,
            **fields,
        )


def _claim(
    conn: Connection,
    request: ResolvedRequest,
    plan: Plan,
    snapshot: Snapshot,
    catalog: Catalog,
    now: datetime,
) -> Plan:
    """Make the plan's claims in CLAIMS order; the first one lost gives the plan that holds."""
    context = ClaimContext(request, snapshot, catalog.policy, now)
    for claim in CLAIMS:
        if not claim.needed(plan):
            continue
        final = claim.claim(conn, plan, context)
        if final is not plan:
            return final
    return plan


def needs_address(adapters: Iterable[Any]) -> dict[str, bool]:
    return {a.channel: a.needs_address for a in adapters}
