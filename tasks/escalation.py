"""Escalation chains (catalog.escalation): start a chain when its first notification is routed,
fire each due step from the beat tick as a normal request through the router, and record every
step and every reason not to escalate as a decision (gate `escalation`, `clarion explain`).

- **Start.** Routing a request of a type with `escalation:` starts its chain in the same
  transaction: step 2 is due `after` from now (counted in working time when the chain says so).
  A request routed to no channel at all (opted out, no address) makes step 2 due at once; one
  deferred (quiet hours) starts its chain when it is routed for real; one collapsed, folded or
  digested starts none (the notification it joined carries the chain).
- **Fire.** The tick takes due chains (`FOR UPDATE SKIP LOCKED`), writes each step's request
  (`escalation:<chain>:<step>`, the chain's variables, the step's type and recipient) and moves the
  timer to the next step, measured from now; the requests are published after commit. Gates
  apply to each step like any request: a `critical` step type (or a category in
  `policy.quiet_hours_bypass`) goes through quiet hours, others are deferred.
- **Steps that cannot reach anyone.** A step's request routed to no channel, or whose every
  delivery failed for good, brings the next step forward to now (db.escalations.hurry). A
  deferred step does not hold the chain: the next step keeps its time.
- **Stop.** db.escalations.delivery_event: an acknowledgement on any step's delivery stops it;
  so does the app (`POST /v1/requests/{id}/ack`) or a person opening the signed `ack_link` every
  step request carries (tasks/escalation_ack.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from clarion import clock, settings
from clarion.catalog import Catalog, NotificationType
from clarion.db import escalations as store
from clarion.db import ledger
from clarion.db.engine import engine
from clarion.gates.contract import Plan
from clarion.rows import Recipient, ResolvedRequest
from clarion.scheduling.worktime import add_working_time
from clarion.tasks import runtime
from clarion.tasks.arming import recipient_calendar
from clarion.tasks.escalation_ack import ack_link
from clarion.tasks.publish import ROUTE, publish

log = logging.getLogger(__name__)
LIMIT = 500  # chains fired per tick
PREFIX = "escalation:"  # the occurrence keys of step requests (reserved: clarion.validation)


def occurrence_key(chain_id: int, step: int) -> str:
    return f"{PREFIX}{chain_id}:{step}"


def timer(
    start: datetime,
    seconds: float,
    working_hours: str | None,
    recipient: Recipient | None,
) -> datetime:
    """When `seconds` of waiting have passed since `start`: plain time, or only the recipient's
    working time (their calendar, the chain's local window) when the chain counts working hours."""
    if working_hours is None or recipient is None:
        return start + timedelta(seconds=seconds)
    opens, closes = working_hours.split("-")
    try:
        return add_working_time(
            start,
            seconds,
            calendar=recipient_calendar(recipient),
            zone=recipient.timezone,
            window=(opens, closes),
        )
    except ValueError:  # a calendar with no working time at all: do not wait forever
        log.exception("working-time timer failed", extra={"action": "escalation_timer_failed"})
        return start + timedelta(seconds=seconds)


def _wait_text(seconds: float, working_hours: str | None) -> str:
    shown = f"{seconds / 60:g}m" if seconds >= 60 else f"{seconds:g}s"
    return shown + (f" of working time ({working_hours} on working days)" if working_hours else "")


def routed(
    conn: Connection,
    request: ResolvedRequest,
    ntype: NotificationType | None,
    plan: Plan,
    recipient: Recipient | None,
    catalog: Catalog,
    now: datetime,
) -> None:
    """The route task's hook, in its transaction: start a chain, or note what routing a step's
    request means for its chain."""
    if ntype is None:
        return
    if ntype.key in catalog.escalation_step_types:
        chain = store.lock_by_request(conn, request.user_id, request.id)
        if chain is not None and chain.step > 1:
            _step_routed(conn, chain, plan, now)
            return
    if ntype.escalation is not None and recipient is not None:
        _start(conn, request, ntype, plan, recipient, now)


def _start(
    conn: Connection,
    request: ResolvedRequest,
    ntype: NotificationType,
    plan: Plan,
    recipient: Recipient,
    now: datetime,
) -> None:
    spec = ntype.escalation
    assert spec is not None  # routed() checks
    origin = (request.user_id, request.id)
    outcome = plan.outcome
    if outcome == "defer":
        return  # routed again when the deferral ends; the chain starts then
    if outcome not in ("deliver", "suppress"):
        store.decide(
            conn,
            origin,
            "stop",
            "not_started",
            f"the request was not sent on its own ({outcome})",
            now,
        )
        return
    variables = {**ntype.defaults, **request.variables}
    steps: list[dict[str, Any]] = [
        {
            "type": s.type_key,
            "user": variables.get(s.to) if s.to else request.user_id,
            "to": s.to,
            "after": s.after,
        }
        for s in spec.steps
    ]
    hours = "-".join(spec.working_hours) if spec.working_hours else None
    first = steps[0]
    if outcome == "deliver":
        due, reason = timer(now, first["after"], hours, recipient), "no_ack"
        detail = (
            f"step 2 ({first['type']} to {first['user']}) due at {due.isoformat()} unless "
            f"acknowledged: {_wait_text(first['after'], hours)} after step 1"
        )
    else:
        due, reason = now, "step_not_delivered"
        detail = "step 1 went to no channel: step 2 is due now"
    if store.start_chain(
        conn,
        origin,
        type_key=ntype.key,
        steps=steps,
        working_hours=hours,
        due_at=due,
        due_reason=reason,
        due_detail=detail,
        now=now,
    ):
        store.decide(conn, origin, "wait" if reason == "no_ack" else "hurry", reason, detail, now)


def _step_routed(conn: Connection, chain: store.Locked, plan: Plan, now: datetime) -> None:
    outcome = plan.outcome
    what = f"step {chain.step} (request {chain.request_id})"
    if outcome == "suppress":
        store.hurry(conn, chain, "step_not_delivered", f"{what} went to no channel", now)
    elif outcome == "defer" and chain.state == "waiting" and chain.step == chain.next_step - 1:
        store.decide(
            conn,
            (chain.chain_user, chain.origin_request),
            "wait",
            "step_deferred",
            f"{what} is held until {plan.defer_until.isoformat() if plan.defer_until else '?'}; "
            f"step {chain.next_step} stays due at "
            f"{chain.due_at.isoformat() if chain.due_at else '?'}",
            now,
        )


def tick() -> int:
    """The beat tick's step: fire due chains in one transaction, publish their requests after."""
    with engine().begin() as conn:
        keys = fire_due(conn, now=clock.now())
    publish(ROUTE, keys)
    return len(keys)


@dataclass(frozen=True)
class _Firing:
    """A due step about to be requested."""

    chain: store.Chain
    step: int
    spec: Mapping[str, Any]
    next_due: datetime | None  # the following step's timer; None: this is the last step
    row: ledger.NewRequest


def fire_due(conn: Connection, *, now: datetime, limit: int = LIMIT) -> list[tuple[str, int, str]]:
    """Fire the next step of every due chain; the (user, request id, lane) of the new requests."""
    due = store.take_due(conn, now=now, limit=limit)
    if not due:
        return []
    wanted = {c.user_id for c in due} | {str(c.steps[c.next_step - 2].get("user")) for c in due}
    people = ledger.recipients(conn, wanted)
    firing = [f for chain in due if (f := _step(conn, chain, people, now)) is not None]
    stray = now + timedelta(seconds=settings.get().stray_after)
    created = ledger.insert_requests(conn, [f.row for f in firing], now=now, due_at=stray)
    made = list(zip(firing, created, strict=True))
    store.link_requests(
        conn,
        [(f.row.user_id, rid, f.chain.user_id, f.chain.id, f.step) for f, (rid, _) in made],
    )
    for f, (rid, _) in made:
        _fired_decisions(conn, f, rid, now)
    log.info("escalated", extra={"action": "escalation_fired", "steps": len(made)})
    return [(f.row.user_id, rid, f.row.lane) for f, (rid, new) in made if new]


def _step(
    conn: Connection, chain: store.Chain, people: Mapping[str, Recipient], now: datetime
) -> _Firing | None:
    """Move the chain's timer past its due step; the step to request, or None if it is skipped."""
    step = chain.next_step
    spec = chain.steps[step - 2]
    last = step - 1 >= len(chain.steps)
    owner = people.get(chain.user_id)
    next_due = (
        None if last else timer(now, chain.steps[step - 1]["after"], chain.working_hours, owner)
    )
    if spec.get("user") not in people:
        _skip(conn, chain, spec, now, None if last else now)
        return None
    store.advance(conn, chain.key, from_step=step, due_at=next_due, now=now)
    catalog = runtime.catalog()
    ntype, own = catalog.get(spec["type"]), catalog.get(chain.type_key)
    row = ledger.NewRequest(
        str(spec["user"]),
        spec["type"],
        occurrence_key(chain.id, step),
        ntype.lane if ntype else "transactional",
        ntype.version if ntype else 0,
        {
            **(own.defaults if own else {}),  # a step may need a defaulted one
            **chain.variables,
            "ack_link": ack_link(chain.user_id, chain.request_id, now=now),
        },
    )
    return _Firing(chain, step, spec, next_due, row)


def _fired_decisions(conn: Connection, f: _Firing, request_id: int, now: datetime) -> None:
    """On the chain's first request: which step fired and why; on the step's own request: whose
    chain it belongs to."""
    chain, origin = f.chain, (f.chain.user_id, f.chain.request_id)
    why = (
        f"{_wait_text(f.spec['after'], chain.working_hours)} without an acknowledgement"
        if chain.due_reason == "no_ack"
        else f"at once: {chain.due_detail}"
    )
    store.decide(
        conn,
        origin,
        "escalate",
        chain.due_reason,
        f"step {f.step} ({f.spec['type']} to {f.spec['user']}, request {request_id}): {why}"
        + (f"; step {f.step + 1} due at {f.next_due.isoformat()}" if f.next_due else ""),
        now,
    )
    store.decide(
        conn,
        (f.row.user_id, request_id),
        "escalate",
        "step_of_chain",
        f"step {f.step} of {chain.user_id}'s {chain.type_key} (request {chain.request_id}, "
        f"chain {chain.id})",
        now,
    )
    if f.next_due is None:
        _finished(conn, chain, f.step, now)


def _finished(conn: Connection, chain: store.Chain, step: int, now: datetime) -> None:
    store.decide(
        conn,
        (chain.user_id, chain.request_id),
        "stop",
        "chain_finished",
        f"step {step} was the last; nothing further",
        now,
    )


def _skip(
    conn: Connection,
    chain: store.Chain,
    spec: Mapping[str, Any],
    now: datetime,
    next_due: datetime | None,
) -> None:
    """A step whose recipient is not registered (or whose variable named nobody) is skipped; the
    next one is due at once, since this one reached no one."""
    step = chain.next_step
    store.advance(conn, chain.key, from_step=step, due_at=next_due, now=now)
    who = f"variable {spec['to']!r}" if spec.get("to") else "the chain's recipient"
    store.decide(
        conn,
        (chain.user_id, chain.request_id),
        "skip",
        "unknown_recipient",
        f"step {step} ({spec['type']}): {who} names no registered recipient "
        f"({spec.get('user')!r})" + (f"; step {step + 1} is due now" if next_due else ""),
        now,
    )
    if next_due is None:
        _finished(conn, chain, step, now)
