"""A request's history as one time-ordered list of steps, each with its reason in words: what the
activity page shows (web/activity.py) and what `GET /v1/requests/{id}` answers as `timeline`.

The records come from db/activity.py (the module `clarion explain` reads too); this module only
orders them and says what each means. A delivery gives several steps: queued, each settled attempt
with its outcome, the attempt in flight, an answer that was lost, sent, and the next attempt when
one is owed. The
words a support person reads are here, in one place; an unknown reason code falls back to the
code as words, never to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from clarion.catalog.model import readable
from clarion.db.activity import Delivery, RequestHistory
from clarion.db.schema import SENT_STATES
from clarion.scheduling.zones import load_zone

# stage: the kind of step, in the order the page's legend names them
STAGES = ("request", "decision", "delivery", "receipt", "incident", "event")
SEND_GATES = ("deliver",)  # decisions recorded by a send, after its delivery was made

REASONS = {
    # gate decisions
    "opted_out": "The recipient turned this kind of notification off.",
    "suppressed_address": "The address is on the suppression list (a bounce, complaint or STOP).",
    "no_channel": "No channel was left to send on, so nothing was sent.",
    "no_address": "The recipient has no address for this channel.",
    "no_adapter": "No provider is configured for this channel.",
    "other_platform": "Sent on the recipient's other platform instead.",
    "unknown_recipient": "The recipient is not registered.",
    "unknown_type": "The notification type is not in the catalog.",
    "quiet_hours": "Held back during the recipient's quiet hours; sent when they end.",
    "outside_quiet_hours": "Outside the recipient's quiet hours.",
    "bypass": "Allowed through quiet hours (urgent or security).",
    "activation_window": "Outside the activation window for this type.",
    "non_working_day": "Held back: not a working day for the recipient.",
    "marketing_sms_hours": "Held back: outside the hours marketing texts may be sent.",
    "fatigue_cap": "The recipient already got as many notifications as the cap allows.",
    "under_cap": "Under the recipient's notification cap.",
    "collapsed": "Folded into an earlier notification of the same group.",
    "merged": "Merged into an earlier notification of the same group.",
    "digested": "Added to a summary that is sent later.",
    "missed": "Its time passed before it could be sent.",
    "exempt": "Not subject to the activation window.",
    "opens_window": "Opens the recipient's activation window.",
    "leads_group": "The first of its group: sent.",
    "no_answer": "The provider took the message but its answer was lost; it may have arrived. "
    "Held as unknown and not sent again, so it cannot arrive twice.",
    # receipts
    "delivered": "The provider reports it delivered.",
    "bounced": "The provider reports it bounced: the address does not take messages. The "
    "address was put on the suppression list.",
    "soft_bounced": "The provider reports a temporary failure (e.g. a full mailbox).",
    "complained": "The recipient marked it as spam; the address was suppressed.",
    "opened": "The recipient opened it.",
    "clicked": "The recipient clicked a link in it.",
    "failed": "The provider reports it failed.",
    "undelivered": "The provider reports it could not be delivered.",
    "unsubscribed": "The recipient unsubscribed.",
    # incidents
    "outcome_unknown": "An attempt's answer was lost: it may or may not have arrived.",
    "possible_duplicate": "Sent again after a lost answer: the recipient may have got it twice.",
    "repeat": "Sent again after a lost answer; the receiver recognised the repeat.",
}
STATES = {
    "pending": "waiting to be sent",
    "claimed": "being sent",
    "unknown": "held: outcome unknown",
    "sent": "sent",
    "failed": "failed",
}
ATTEMPTS = {  # how an attempt ended (db.schema.ATTEMPT_OUTCOMES), in words
    "sent": "The provider took it",
    "retrying": "The provider refused it or could not be reached; it is tried again later",
    "unknown": "The provider's answer was lost: it may have arrived; the next attempt checks first",
    "held": "The provider's answer was lost: it may have arrived; held, not sent again",
    "failed": "Failed for good: not tried again",
    "exhausted": "No attempts left: failed for good",
}
OUTCOMES = {
    "allow": "allowed",
    "suppress": "stopped",
    "defer": "deferred",
    "fold": "folded",
    "collapse": "collapsed",
    "digest": "digested",
    "unknown": "outcome unknown",
}


@dataclass(frozen=True)
class Step:
    at: datetime
    stage: str
    channel: str | None
    what: str  # a short title: "quiet_hours deferred", "email bounced"
    reason: str  # the code (a decision's reason, a receipt's event, an incident's kind)
    words: str  # the reason in words
    detail: str


def words(reason: str, detail: str = "") -> str:
    """A reason code in words (the code as words when it has none of its own)."""
    return REASONS.get(reason) or f"{readable(reason).capitalize()}."


def timeline(history: RequestHistory, now: datetime) -> list[Step]:
    """Every step of a request in time order (a step owed in the future last)."""
    event = f" (event {history.event_id})" if history.event_id else ""
    steps = [
        Step(
            history.created_at,
            "request",
            None,
            f"{readable(history.type_key)} requested",
            "requested",
            f"The app asked for a {history.type_key} notification{event}.",
            history.occurrence_key,
        )
    ]
    for d in history.decisions:
        outcome = OUTCOMES.get(d.outcome, d.outcome)
        steps.append(
            Step(
                d.decided_at,
                "decision",
                d.channel,
                f"{readable(d.gate)}: {outcome}",
                d.reason,
                words(d.reason),
                d.detail,
            )
        )
    for delivery in history.deliveries:
        steps += _delivery_steps(delivery, now)
    for r in history.receipts:
        note = "" if r.outcome == "applied" else f" (receipt {r.outcome}: changed nothing)"
        steps.append(
            Step(
                r.received_at,
                "receipt",
                r.channel,
                f"{r.channel} {r.event}",
                r.event,
                words(r.event) + note,
                r.detail,
            )
        )
    for i in history.incidents:
        steps.append(
            Step(
                i.created_at,
                "incident",
                i.channel,
                readable(i.kind),
                i.kind,
                words(i.kind),
                i.detail,
            )
        )
    for e in history.events:
        steps.append(
            Step(
                e.created_at,
                "event",
                e.channel,
                f"event {e.kind}",
                e.kind,
                f"Told the app's endpoints ({e.id}): {e.taken} took it, {e.pending} still owed.",
                "",
            )
        )
    sending = {f"{readable(g)}: " for g in SEND_GATES}

    def order(step: Step) -> tuple[datetime, float]:
        """Time first; at the same instant, the order things happen in: the gates, then a
        delivery is made, then its send is decided on (the sort keeps a delivery's own steps in
        the order given)."""
        rank = float(STAGES.index(step.stage))
        if step.stage == "decision" and any(step.what.startswith(g) for g in sending):
            rank = STAGES.index("delivery") + 0.5
        return step.at, rank

    return sorted(steps, key=order)


def _delivery_steps(d: Delivery, now: datetime) -> list[Step]:
    state = STATES.get(d.state, d.state)
    steps = [
        Step(
            d.created_at,
            "delivery",
            d.channel,
            f"{d.channel} delivery created",
            "queued",
            f"A delivery on {d.channel} was made; now {state}, after {d.attempts} "
            f"attempt{'' if d.attempts == 1 else 's'}.",
            d.last_error or "",
        )
    ]
    for a in d.history:
        via = f" ({a.platform})" if a.platform else ""
        steps.append(
            Step(
                a.at,
                "delivery",
                d.channel,
                f"{d.channel} attempt {a.attempt}: {a.outcome}",
                f"attempt_{a.outcome}",
                f"Attempt {a.attempt}: " + ATTEMPTS.get(a.outcome, readable(a.outcome)) + f"{via}.",
                a.error,
            )
        )
    if d.send_started_at is not None:
        steps.append(
            Step(
                d.send_started_at,
                "delivery",
                d.channel,
                f"{d.channel} attempt {d.attempts}",
                "attempt",
                f"Attempt {d.attempts} reached the provider.",
                "",
            )
        )
    if d.maybe_sent_at is not None and d.state != "unknown":
        steps.append(
            Step(
                d.maybe_sent_at,
                "delivery",
                d.channel,
                f"{d.channel} answer lost",
                "maybe_sent",
                "The provider's answer was lost: the message may have arrived.",
                d.last_error or "",
            )
        )
    if d.sent_at is not None:
        via = f" through {d.platform}" if d.platform else ""
        steps.append(
            Step(d.sent_at, "delivery", d.channel, f"{d.channel} sent", "sent", f"Sent{via}.", "")
        )
    if d.next_attempt_at is not None:
        late = " (overdue: waits for the next tick)" if d.next_attempt_at < now else ""
        steps.append(
            Step(
                d.next_attempt_at,
                "delivery",
                d.channel,
                f"{d.channel} next attempt",
                "next_attempt",
                f"Attempt {d.attempts + 1} is due then{late}.",
                d.last_error or "",
            )
        )
    return steps


def zone(name: str | None) -> ZoneInfo | None:
    """The IANA zone `name`, or None when it is not one."""
    try:
        return load_zone(name) if name else None
    except ValueError:
        return None


def local(at: datetime, tz: ZoneInfo) -> str:
    """`at` in `tz`, as a person reads it: `2026-12-07 04:00:00 EST`."""
    return at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def relative(at: datetime, now: datetime) -> str:
    """'in 4m 10s', '2h 0m ago', 'now': how far `at` is from `now`, in its largest unit and the
    next one (rounded down to whole seconds)."""
    seconds = int((at - now).total_seconds())
    if seconds == 0:
        return "now"
    left = abs(seconds)
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    first = next(i for i, (_, size) in enumerate(units) if left >= size)
    parts = [f"{left // units[first][1]}{units[first][0]}"]
    if first + 1 < len(units):
        unit, size = units[first + 1]
        parts.append(f"{left % units[first][1] // size}{unit}")
    text = " ".join(parts)
    return f"in {text}" if seconds > 0 else f"{text} ago"


def verdict(r: RequestHistory, now: datetime) -> str:
    sent = [
        d.channel + ("" if d.state == "sent" else f" ({d.state})")
        for d in r.deliveries
        if d.state in SENT_STATES
    ]
    if sent:
        return "sent on " + ", ".join(sent)
    if r.state == "deferred" and r.due_at is not None:
        return f"deferred until {_when(r.due_at)} UTC ({relative(r.due_at, now)})"
    if r.state == "pending":
        return "waiting to be routed"
    waiting = [
        d.next_attempt_at for d in r.deliveries if d.state == "pending" and d.next_attempt_at
    ]
    if waiting:
        first = min(waiting)
        return f"being delivered; next attempt {_when(first)} UTC ({relative(first, now)})"
    if any(d.state == "claimed" for d in r.deliveries):
        return "being delivered"
    held = [d.channel for d in r.deliveries if d.state == "unknown"]
    if held:
        return f"outcome unknown on {', '.join(held)}: may have arrived; held, not sent again"
    reasons = [d.reason for d in r.decisions if d.channel is None and d.reason != "no_channel"]
    reasons = reasons or sorted({d.reason for d in r.decisions if d.channel})
    return "not sent: " + (", ".join(reasons[-1:] if reasons else ["no decision recorded"]))


UTC = load_zone("UTC")
