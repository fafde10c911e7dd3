"""`clarion arm --dry-run`, `clarion schedule` and `clarion simulate`: a recipient's series, ahead of time."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from clarion import clock
from clarion.db import ledger
from clarion.db import series as store
from clarion.db.engine import engine
from clarion.errors import UnknownRecipient
from clarion.gates.apply import needs_address, snapshots
from clarion.gates.contract import Snapshot
from clarion.gates.pipeline import plan
from clarion.gates.simulate import applied
from clarion.ops.table import render
from clarion.rows import DraftRequest
from clarion.scheduling.series import describe, preview
from clarion.scheduling.zones import load_zone
from clarion.tasks import runtime
from clarion.tasks.series import recipient_calendar, validate


def _local(at: datetime, zone: str) -> str:
    return at.astimezone(load_zone(zone)).strftime("%a %Y-%m-%d %H:%M %Z")


def arm_preview(user_id: str, type_key: str, *, occurrences: int = 10, **arm: Any) -> str:
    """The first occurrences of a series that would be armed, with calendar adjustments."""
    with engine().connect() as conn:
        row = validate(conn, user_id, type_key, **arm)
    cal = recipient_calendar(row["recipient"])
    start = datetime(1970, 1, 1, tzinfo=UTC)
    rows = [
        (
            n,
            _local(due, row["zone"]),
            due.strftime("%Y-%m-%d %H:%M UTC"),
            occ.action,
            describe(occ, row["zone"]),
        )
        for n, due, _, occ in preview(
            row, cal, start=start, end=datetime.max.replace(tzinfo=start.tzinfo), limit=occurrences
        )
    ]
    title = (
        f"dry run — {type_key} for {user_id} every {row['every']} from {row['anchor_local']} "
        f"{row['zone']} (calendar: {cal.source}; non-working days: {row['calendar_policy']})"
    )
    return render(["n", "local time", "UTC", "calendar", "note"], rows, title)


def _upcoming(user_id: str, days: int):
    now = clock.now()
    with engine().connect() as conn:
        recipients = ledger.recipients(conn, [user_id])
        if user_id not in recipients:
            raise UnknownRecipient(user_id)
        active = [s for s in store.series_of(conn, user_id) if s["state"] == "active"]
        snapshot = snapshots(conn, recipients, now=now)[user_id]
    recipient = recipients[user_id]
    cal = recipient_calendar(recipient)
    end = now + timedelta(days=days)
    events = [
        (occ.send_at or due, s, n, occ)
        for s in active
        for n, due, _, occ in preview(s, cal, start=now, end=end, limit=100_000)
    ]
    events.sort(key=lambda e: (e[0], e[1]["id"], e[2]))
    return recipient, snapshot, events


def _run(snapshot: Snapshot, events, *, evolve: bool):
    catalog = runtime.catalog()
    reachable = needs_address(runtime.adapters().values())
    for at, s, n, occ in events:
        if occ.action in ("skipped", "merged"):
            yield at, s, n, occ.action, describe(occ, s["zone"])
            continue
        request = DraftRequest(
            s["user_id"],
            -(s["id"] * 1_000_000 + n),
            s["type_key"],
            f"series:{s['id']}:{n}",
            s["variables"],
        )
        p = plan(
            request,
            catalog.get(s["type_key"]),
            snapshot,
            now=at,
            policy=catalog.policy,
            needs_address=reachable,
        )
        why = "; ".join(f"{d.gate}: {d.reason}" for d in p.decisions if d.channel is None)
        yield at, s, n, p.outcome, "; ".join(filter(None, (describe(occ, s["zone"]), why)))
        if evolve:
            snapshot = applied(snapshot, p, request)


def schedule(user_id: str, days: int) -> str:
    """What will fire for a recipient in the next `days`, when (local time), and why not."""
    recipient, snapshot, events = _upcoming(user_id, days)
    rows = [
        (_local(at, recipient.timezone), s["type_key"], f"#{s['id']}/{n}", outcome, why)
        for at, s, n, outcome, why in _run(snapshot, events, evolve=False)
    ]
    return render(
        ["when (recipient's time)", "type", "series/n", "outcome", "why"],
        rows,
        f"schedule for {user_id}, next {days} days ({recipient.timezone})",
    )


def simulate(user_id: str, days: int, show: int = 30) -> str:
    """Run the recipient's series through the real planner on a virtual clock; print what is sent."""
    recipient, snapshot, events = _upcoming(user_id, days)
    outcomes: Counter = Counter()
    lines: list[tuple[str, str, str, str]] = []
    for at, s, _n, outcome, why in _run(snapshot, events, evolve=True):
        outcomes[(s["type_key"], outcome, why if outcome != "deliver" else "")] += 1
        if len(lines) < show:
            lines.append((_local(at, recipient.timezone), s["type_key"], outcome, why))
    summary = render(
        ["type", "outcome", "why", "occurrences"],
        [(*k, v) for k, v in sorted(outcomes.items())],
        f"simulation for {user_id}: {days} days, {len(events)} occurrences, virtual clock",
    )
    first = render(["when", "type", "outcome", "why"], lines, f"first {len(lines)} occurrences")
    return summary + "\n\n" + first
