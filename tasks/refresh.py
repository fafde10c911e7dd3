"""Collapse in place: keep a collapse leader's message showing its group's running count.

A follower's decision stays `collapsed into <leader>`; routing it also owes the leader's message
an update (db.refresh, a row with a due time, no Celery ETA). This job — a task on the control
lane that the beat tick publishes when a row is due — takes the due rows and, for every delivery
of the leader that was sent on a channel that can update in place (`Channel.update`: Slack chat.update, a Teams card refresh, the in-app
item's title and body — its count is raised by the router itself), re-renders
the leader's template with `collapsed_count` (the group so far, the leader included) and
`collapse_open`, and sets the message to it.

Coalescing. Followers only bring a row's due time forward, to at most `update_seconds` after
themselves, and a finished update leaves nothing owed until the next follower — so a storm of
followers costs one update per group per `update_seconds`, plus one closing update when the
window ends (the final count, `collapse_open` false). Each update first spends the channel's
budget (adapters.ratelimit: Slack's chat.update budget per workspace, Teams' per conversation);
a full budget puts the row back until the budget has room, and the update sent then carries the
count of that moment, so waiting coalesces further instead of queueing calls.

At least once, on purpose. An update sets the whole message to the count at that moment; sending
it twice, or after a crash (the row's lease on PostgreSQL's clock runs out and it is taken again),
shows the same or a newer count. No ledger of updates is needed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import shared_task

from clarion import clock
from clarion.adapters.base import can_update
from clarion.catalog import NotificationType
from clarion.catalog.options import DEFAULT_UPDATE_SECONDS
from clarion.db import refresh
from clarion.db.engine import engine
from clarion.db.refresh import LeaderDelivery, OwedRefresh
from clarion.errors import PermanentSendError, ThrottledError
from clarion.records import Message
from clarion.tasks import runtime

log = logging.getLogger(__name__)

BATCH = 50  # rows per run
LEASE = 120.0  # seconds a run holds its rows (PostgreSQL's clock)
RETRY = timedelta(seconds=60)  # a row taken by a run that died is due again this much later
GIVE_UP = timedelta(hours=1)  # after the window's end, a row that cannot be finished is dropped
RETAIN = timedelta(days=1)  # a finished row keeps its group's count this long after its window
UPDATABLE = frozenset({"sent", "delivered", "opened", "read", "clicked", "answered"})
NOT_YET = frozenset({"pending", "claimed", "unknown"})  # the leader may still be sent


@dataclass(frozen=True)
class Outcome:
    """What one row's run did: updates made, and when to come back (None: done)."""

    updated: int
    again_at: datetime | None


# No task events, like the tick that publishes it: while a storm lasts it runs every second.
@shared_task(name="clarion.refresh_collapsed", send_events=False)
def refresh_collapsed() -> int:
    """Send the updates that are due; returns how many messages were updated."""
    return refresh_due()


def publish_if_due(now: datetime, *, expires: float) -> int:
    """The tick's step: publish one refresh run (control queue) when an update is owed now, so
    a quiet system runs none; two runs at once only split the rows (SKIP LOCKED). 1 if published."""
    with engine().connect() as conn:
        if not refresh.any_due(conn, now=now):
            return 0
    refresh_collapsed.apply_async(queue="control", expires=expires)
    return 1


def refresh_due(*, limit: int = BATCH) -> int:
    """Take due rows and update their leaders' messages (see the module docstring)."""
    now = clock.now()
    with engine().begin() as conn:
        owed = refresh.take_due(conn, now=now, retry_at=now + RETRY, lease=LEASE, limit=limit)
        leaders = refresh.leader_deliveries(conn, [o.key for o in owed])
    updated = 0
    for row in owed:
        outcome = _refresh(row, leaders.get(row.key, []), now)
        if outcome.again_at is not None and now - row.window_until > GIVE_UP:
            log.warning(  # a leader never sent, or an update that keeps failing
                "collapse updates given up",
                extra={"action": "collapse_update_given_up", "request": row.leader_id},
            )
            outcome = Outcome(outcome.updated, None)
        updated += outcome.updated
        with engine().begin() as conn:
            if outcome.again_at is None:
                refresh.finish(conn, row, now=now)
            else:
                refresh.again(conn, row, at=outcome.again_at)
    if len(owed) < limit:  # a quiet run: tidy up finished rows
        with engine().begin() as conn:
            refresh.forget_finished(conn, before=now - RETAIN, limit=limit)
    if updated:
        runtime.count("collapse_updates", updated)
    return updated


def _refresh(row: OwedRefresh, deliveries: list[LeaderDelivery], now: datetime) -> Outcome:
    ntype = runtime.catalog().get(deliveries[0].type_key) if deliveries else None
    spacing = timedelta(seconds=ntype.collapse_update_seconds if ntype else DEFAULT_UPDATE_SECONDS)
    updated, again_at = 0, None
    for delivery in deliveries:
        adapter = runtime.adapters().get(delivery.channel)
        if delivery.state in NOT_YET:
            again_at = _earliest(again_at, now + spacing)
            continue
        if (
            ntype is None
            or delivery.state not in UPDATABLE
            or not delivery.provider_message_id
            or not can_update(adapter)
        ):
            continue
        try:
            message, answered = _message(ntype, delivery, row, now)
            adapter.update(message, delivery.provider_message_id, answered)  # type: ignore[union-attr]
            updated += 1
        except ThrottledError as full:
            again_at = _earliest(again_at, now + timedelta(seconds=full.retry_after or 1.0))
        except PermanentSendError as error:  # the message is gone: nothing to keep current
            log.info(
                "collapse update refused: %s",
                error,
                extra={"action": "collapse_update_refused", "delivery": delivery.id},
            )
        except Exception:  # a transient SendError, or a bug: tried again after the spacing
            log.exception(
                "collapse update failed",
                extra={"action": "collapse_update_failed", "delivery": delivery.id},
            )
            again_at = _earliest(again_at, now + spacing)
    return Outcome(updated, again_at)


def _earliest(current: datetime | None, candidate: datetime) -> datetime:
    return candidate if current is None else min(current, candidate)


def _message(
    ntype: NotificationType, delivery: LeaderDelivery, row: OwedRefresh, now: datetime
) -> tuple[Message, str | None]:
    """The leader's message re-rendered with the live count, and its recorded answer's label."""
    version = delivery.template_version
    template = ntype.templates[version]
    variables = {
        **delivery.variables,
        "collapsed_count": row.count,
        "collapse_open": row.window_until > now,
    }
    button = template.button(delivery.answer) if delivery.answer else None
    message = Message(
        delivery_id=delivery.id,
        user_id=delivery.user_id,
        type_key=ntype.key,
        occurrence_key=delivery.occurrence_key,
        channel=delivery.channel,
        content=ntype.render(version, delivery.channel, variables, delivery.locale),
        address=delivery.addresses.get(delivery.channel),
        config=ntype.config.get(delivery.channel, {}),
        buttons=template.buttons,
        lane=delivery.lane,
        category=ntype.category,
        collapse_key=row.collapse_key,
    )
    return message, button.label if button else None
