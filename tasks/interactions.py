"""Button clicks from chat platforms: untrusted input, validated against the catalog and the delivery.

`handle_click` never raises and never changes anything for a forged, stale, foreign or malformed
payload; every click, accepted or not, is recorded in `interactions`. The first answer wins by a
conditional update; a later click is told the answer already recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from adapters.base import ButtonValue, decode_value
from catalog import Button
from clarion import clock
from db import interactions as store
from db.engine import engine
from tasks import runtime

log = logging.getLogger(__name__)
OPEN_STATES = ("sent", "delivered", "read")


@dataclass(frozen=True)
class Click:
    outcome: str  # accepted | repeated | rejected
    reason: str
    value: ButtonValue | None = None
    answer: str | None = None  # the answer now recorded on the delivery
    label: str | None = None  # that answer's label, from the catalog
    target: dict | None = None  # the delivery (channel, provider_message_id, ...) for updating in place

    @property
    def changed(self) -> bool:
        return self.outcome == "accepted"


def handle_click(platform: str, platform_user: str, raw_value: object) -> Click:
    """Validate and apply one button click. Returns what happened; raises nothing."""
    now = clock.now()
    raw_text = raw_value if isinstance(raw_value, str) else repr(raw_value)
    value = decode_value(raw_value)
    try:
        with engine().begin() as conn:
            click = _judge(conn, platform, str(platform_user), value, now)
            store.record_interaction(conn, user_id=value.user_id if value else "",
                                     delivery_id=value.delivery_id if value else None, platform=platform,
                                     platform_user=str(platform_user), answer=value.answer if value else None,
                                     outcome=click.outcome, reason=click.reason, payload=raw_text, now=now)
    except Exception:  # an outage must not reach the chat client as an error; it is logged
        log.exception("interaction failed", extra={"action": "interaction_error", "platform": platform})
        return Click("rejected", "internal_error", value)
    if click.changed:
        _follow_up(click)
    log.info("interaction", extra={"action": f"interaction_{click.outcome}", "reason": click.reason})
    return click


def _judge(conn, platform: str, platform_user: str, value: ButtonValue | None, now) -> Click:
    if value is None:
        return Click("rejected", "malformed")
    target = store.interaction_target(conn, value.user_id, value.delivery_id)
    if target is None:
        return Click("rejected", "unknown_delivery", value)
    if target["platform"] != platform or target["channel"] != platform:
        return Click("rejected", "wrong_platform", value)
    if (target["addresses"] or {}).get(platform) != platform_user:
        return Click("rejected", "foreign_user", value)
    button = _button(target, value.answer)
    if button is None:
        return Click("rejected", "unknown_answer", value)
    if target["state"] == "answered":
        return Click("repeated", "already_answered", value, target["answer"],
                     _label(target, target["answer"]), target)
    if target["state"] not in OPEN_STATES:
        return Click("rejected", "not_open", value)
    won, recorded = store.answer_once(conn, (value.user_id, value.delivery_id), answer=button.key,
                                      by=f"{platform}:{platform_user}", now=now)
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


def _follow_up(click: Click) -> None:
    """Answers that steer a series: stop it, or hold its next occurrence."""
    from tasks.series import cancel_series, snooze_occurrence

    button = _button(click.target, click.answer)
    occurrence = click.target["occurrence_key"]
    if button is None or button.action == "answer" or not occurrence.startswith("series:"):
        return
    _, series_id, n = occurrence.split(":")
    user = click.value.user_id
    if button.action == "stop_series":
        cancel_series(user, int(series_id))
    elif button.action == "snooze":
        snooze_occurrence(user, int(series_id), int(n) + 1, clock.now() + timedelta(hours=button.hours))
