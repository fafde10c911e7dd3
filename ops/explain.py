"""`clarion explain` and `clarion send --dry-run`: readable answers to "why (not)?"."""

from __future__ import annotations

from datetime import datetime, timedelta

from clarion import clock
from clarion.db import activity, ledger
from clarion.db.activity import Delivery
from clarion.db.engine import engine
from clarion.errors import InvalidRequest, UnknownRecipient
from clarion.gates.contract import Plan
from clarion.ops.table import render
from clarion.web.activity_view import relative, verdict

__all__ = ["explain", "parse_since", "plan_table", "relative", "verdict"]


def parse_since(value: str | None) -> datetime:
    """'2d', '6h', '30m' ago, or an ISO timestamp; default: 30 days ago."""
    if not value:
        return clock.now() - timedelta(days=30)
    units = {"d": "days", "h": "hours", "m": "minutes"}
    if value[-1:] in units and value[:-1].isdigit():
        return clock.now() - timedelta(**{units[value[-1]]: int(value[:-1])})
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidRequest(f"--since takes 2d, 6h, 30m or an ISO time, not {value!r}") from exc
    if parsed.tzinfo is None:
        raise InvalidRequest("--since needs a time zone, e.g. 2026-11-01T00:00+00:00")
    return parsed


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _next_attempt(d: Delivery, now: datetime) -> tuple:
    """The row for when a pending delivery is tried next (a claimed one: when its lease runs out)."""
    at = d.next_attempt_at
    assert at is not None
    if d.state == "claimed":
        what = f"lease ends {relative(at, now)}; tried again then if not settled"
    else:
        what = f"{relative(at, now)}" + (" (overdue: waits for a tick)" if at < now else "")
    return ("next", at, d.channel, "attempt", f"#{d.attempts + 1}", "", what)


def explain(
    user_id: str, *, type_key: str | None = None, since: str | None = None, limit: int = 20
) -> str:
    with engine().connect() as conn:
        if user_id not in ledger.recipients(conn, [user_id]):
            raise UnknownRecipient(user_id)
        rows = activity.requests_of(
            conn, user_id, type_key=type_key, since=parse_since(since), limit=limit
        )
        listed = activity.suppressions(conn, user_id)
    now = clock.now()
    blocks = []
    if listed:
        blocks.append(
            render(
                ["since (UTC)", "channel", "address", "reason", "detail"],
                [(_when(r.created_at), r.channel, r.address, r.reason, r.detail) for r in listed],
                f"{user_id} is on the suppression list for:",
            )
        )
    if not rows:
        blocks.append(
            f"No requests for {user_id}"
            + (f" of type {type_key}" if type_key else "")
            + " in that period."
        )
        return "\n\n".join(blocks)
    for r in rows:
        title = (
            f"request {r.id}  {r.type_key}  ({r.occurrence_key})  requested "
            f"{_when(r.created_at)} UTC — {verdict(r, now)}"
        )
        lines: list[tuple[str, datetime | None, str, str, str, str, str]] = [
            ("decided", d.decided_at, d.gate, d.outcome, d.reason, d.channel or "", d.detail)
            for d in r.decisions
        ]
        lines += [
            (
                "delivery",
                d.sent_at,
                d.channel,
                d.state,
                f"attempts {d.attempts}",
                d.platform or "",
                d.last_error or "",
            )
            for d in r.deliveries
        ]
        lines += [
            ("attempt", a.at, d.channel, a.outcome, f"#{a.attempt}", a.platform or "", a.error)
            for d in r.deliveries
            for a in d.history
        ]
        lines += [
            ("receipt", e.received_at, e.channel, e.event, e.outcome, "", e.detail)
            for e in r.receipts
        ]
        lines += [_next_attempt(d, now) for d in r.deliveries if d.next_attempt_at]
        lines += [
            ("incident", i.created_at, i.channel, i.kind, "", "", i.detail) for i in r.incidents
        ]
        lines.sort(key=lambda x: x[1] or datetime.max.replace(tzinfo=clock.now().tzinfo))
        blocks.append(
            render(
                ["", "time (UTC)", "gate / channel", "outcome", "reason", "channel", "detail"],
                [(a, _when(t), *rest) for a, t, *rest in lines],
                title,
            )
        )
    return "\n\n".join(blocks)


def plan_table(plan: Plan) -> str:
    rows = [(s.gate, s.channel or "", s.outcome, s.reason, s.detail) for s in plan.steps]
    channels = ", ".join(
        c + (f" (held until {nb.isoformat()})" if nb else "") for c, nb in plan.channels
    )
    head = f"dry run — outcome: {plan.outcome}" + (f" on {channels}" if channels else "")
    if plan.defer_until:
        head += f" until {plan.defer_until.isoformat()}"
    return render(["gate", "channel", "decision", "reason", "detail"], rows, head)
