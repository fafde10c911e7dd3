"""Button clicks from chat platforms: untrusted input, validated against the catalog and the delivery.

`handle_click` never raises and never changes anything for a forged, stale, foreign or malformed
payload; every click, accepted or not, is recorded in `interactions`. The first answer wins by a
conditional update; a later click is told the answer already recorded.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import Connection

from clarion import clock, faults
from clarion.catalog import Button
from clarion.db import escalations
from clarion.db import interactions as store
from clarion.db import series as series_store
from clarion.db.engine import engine
from clarion.records import ButtonValue, decode_value
from clarion.tasks import runtime

log = logging.getLogger(__name__)
OPEN_STATES = ("sent", "delivered", "read")
# Why a delivery that is neither open nor answered takes no answer; anything else is "not_open".
CLOSED_REASONS = {
    "pending": "not_sent",
    "failed": "not_sent",
    "suppressed": "not_sent",
    "claimed": "in_flight",
    "unknown": "unconfirmed",
}
SERIES_KEY = re.compile(r"series:([1-9][0-9]{0,17}):(0|[1-9][0-9]{0,8})")


@dataclass(frozen=True)
class Click:
    outcome: str  # accepted | repeated | rejected
    reason: str
    value: ButtonValue | None = None
    answer: str | None = None  # the answer now recorded on the delivery
    label: str | None = None  # that answer's label, from the catalog
    target: dict | None = (
        None  # the delivery (channel, provider_message_id, ...) for updating in place
    )

    @property
    def changed(self) -> bool:
        return self.outcome == "accepted"


def handle_click(platform: str, platform_user: str, raw_value: object) -> Click:
    """Validate and apply one button click. Returns what happened; raises nothing.

    The answer, its follow-up (stop or snooze the series) and the click's record commit together in
    one transaction: there is no answered delivery whose series kept running."""
    now = clock.now()
    raw_text = raw_value if isinstance(raw_value, str) else repr(raw_value)
    value = decode_value(raw_value)
    try:
        with engine().begin() as conn:
            click = _judge(conn, platform, str(platform_user), value, now)
            if click.changed and value is not None:
                click = _follow_up(conn, click, now)
                escalations.delivery_event(
                    conn,
                    value.user_id,
                    value.delivery_id,
                    "answered",
                    f"{platform} answer {click.answer!r}",
                    now,
                )
            _record(conn, platform, str(platform_user), value, click, raw_text, now)
            faults.hit("click.before_commit")
    except Exception:  # an outage must not reach the chat client as an error; it is logged
        log.exception(
            "interaction failed", extra={"action": "interaction_error", "platform": platform}
        )
        click = Click("rejected", "internal_error", value)
        with (
            contextlib.suppress(Exception),
            engine().begin() as conn,
        ):  # best effort: nothing changed
            _record(conn, platform, str(platform_user), value, click, raw_text, now)
        return click
    log.info(
        "interaction", extra={"action": f"interaction_{click.outcome}", "reason": click.reason}
    )
    return click


def _record(
    conn: Connection,
    platform: str,
    platform_user: str,
    value: ButtonValue | None,
    click: Click,
    raw_text: str,
    now: datetime,
) -> None:
    store.record_interaction(
        conn,
        user_id=value.user_id if value else "",
        delivery_id=value.delivery_id if value else None,
        platform=platform,
        platform_user=platform_user,
        answer=value.answer if value else None,
        outcome=click.outcome,
        reason=click.reason,
        payload=raw_text,
        now=now,
    )


def _judge(
    conn: Connection, platform: str, platform_user: str, value: ButtonValue | None, now: datetime
) -> Click:
    """Every reason is true of the click: who may click, then what, then whether it is still open."""
    if value is None:
        return Click("rejected", "malformed")
    target = store.interaction_target(conn, value.user_id, value.delivery_id)
    if target is None:
        return Click("rejected", "unknown_delivery", value)
    if target["channel"] != platform:
        return Click("rejected", "wrong_platform", value)
    if (target["addresses"] or {}).get(platform) != platform_user:
        return Click("rejected", "foreign_user", value)
    button = _button(target, value.answer)
    if button is None:
        return Click("rejected", "unknown_answer", value)
    if target["state"] == "answered":
        return Click(
            "repeated",
            "already_answered",
            value,
            target["answer"],
            _label(target, target["answer"]),
            target,
        )
    if target["state"] not in OPEN_STATES:
        return Click("rejected", CLOSED_REASONS.get(target["state"], "not_open"), value)
    if target["platform"] != platform:  # sent, but by another platform's adapter
        return Click("rejected", "wrong_platform", value)
    won, recorded = store.answer_once(
        conn,
        (value.user_id, value.delivery_id),
        answer=button.key,
        by=f"{platform}:{platform_user}",
        now=now,
    )
    label = _label(target, recorded)
    if not won:
        return Click("repeated", "already_answered", value, recorded, label, target)
    return Click("accepted", button.action, value, recorded, label, target)


def _button(target: dict, key: str | None) -> Button | None:
    ntype = runtime.catalog().get(target["type_key"])
    template = ntype.templates.get(target["template_version"]) if ntype else None
    return template.button(key) if template and key else None


def _label(target: dict, key: str | None) -> str | None:
    button = _button(target, key)
    return button.label if button else None


def series_occurrence(occurrence_key: str) -> tuple[int, int] | None:
    """(series id, n) of a key exactly like `series:<id>:<n>`; None for anything else."""
    match = SERIES_KEY.fullmatch(occurrence_key)
    return (int(match[1]), int(match[2])) if match else None


def _follow_up(conn: Connection, click: Click, now: datetime) -> Click:
    """Answers that steer a series: stop it, or hold its next occurrence — in the answer's own
    transaction. A key that only looks like a series', or a series of someone else, another type or
    no longer active, changes nothing but the recorded reason."""
    from clarion.tasks.series import cancel_series, snooze_occurrence

    target = click.target
    if target is None:  # _judge gives every accepted click its target: nothing to steer without one
        return click
    button = _button(target, click.answer)
    if button is None or button.action not in ("stop_series", "snooze"):
        return click
    user, type_key = target["user_id"], target["type_key"]
    parsed = series_occurrence(target["occurrence_key"])
    found = series_store.get_series(conn, (user, parsed[0])) if parsed else None
    if parsed is None or found is None or found["type_key"] != type_key:
        return replace(click, reason=f"{button.action}:no_series")
    series_id, n = parsed
    if button.action == "stop_series":
        applied = cancel_series(user, series_id, connection=conn)
    else:
        applied = snooze_occurrence(
            user, series_id, n + 1, now + timedelta(hours=button.hours), connection=conn
        )
    return click if applied else replace(click, reason=f"{button.action}:not_applied")
