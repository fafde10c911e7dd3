"""Alerts, evaluated by a beat entry on the control lane once a minute (CLARION_ALERT_INTERVAL):

- send_rate_drop, per channel: over the last CLARION_ALERT_WINDOW seconds (tasks.send.rate's
  per-minute counters), at least CLARION_ALERT_MIN_SENDS provider calls, and the share that failed
  or ended unknown at least CLARION_ALERT_FAILURE_SHARE (a revoked key: every send fails). Cleared
  by a window with enough sends below the share, or with no failures at all.
- stuck_work, per (requests | deliveries, lane): the oldest due row has waited longer than
  CLARION_ALERT_STUCK_AFTER (no tick publishing, no worker consuming). Cleared when it is not.

A separate beat entry, not part of the tick: the tick's second stays for publishing work, and an
evaluation a minute is plenty for conditions measured in minutes. Each firing and clearing is a
row in `alerts` (one open per kind and subject) and, with CLARION_ALERT_WEBHOOK_URL, a signed
JSON POST (the webhook channel's signature), tried again at each evaluation until it is taken.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis as redis_lib
import urllib3
from celery import shared_task
from sqlalchemy import Connection

from clarion import clock, settings
from clarion.adapters.webhook import sign
from clarion.db import alerts, reports
from clarion.db.alerts import Alert
from clarion.db.engine import engine
from clarion.tasks.send import rate as sendrate

log = logging.getLogger(__name__)
RATE, STUCK = "send_rate_drop", "stuck_work"
POST_SINCE = timedelta(hours=1)  # firings older than this are not posted to a new webhook


@dataclass(frozen=True)
class Reading:
    """One condition measured: firing True (open it), False (clear it), None (cannot say)."""

    kind: str
    subject: str
    firing: bool | None
    value: float
    detail: str


def rate_readings(
    window: dict[str, tuple[int, int]], open_subjects: set[str], *, share: float, min_sends: int
) -> list[Reading]:
    """The pure rule for send_rate_drop: a channel with an open alert and no sends is cleared."""
    out = []
    for channel in sorted(set(window) | open_subjects):
        ok, bad = window.get(channel, (0, 0))
        total = ok + bad
        failed = bad / total if total else 0.0
        firing = _rate_firing(total, bad, failed, share=share, min_sends=min_sends)
        detail = f"{bad} of {total} sends failed or ended unknown ({failed:.0%})"
        out.append(Reading(RATE, channel, firing, round(failed, 4), detail))
    return out


def _rate_firing(
    total: int, bad: int, failed: float, *, share: float, min_sends: int
) -> bool | None:
    if total >= min_sends:
        return failed >= share
    return False if bad == 0 else None  # too few sends to say, and some are failing


def stuck_readings(oldest: list[tuple[str, str, float]], *, after: float) -> list[Reading]:
    """The pure rule for stuck_work, from reports.oldest_due's (kind, lane, seconds)."""
    return [
        Reading(
            STUCK,
            f"{kind}:{lane}",
            seconds > after,
            round(seconds, 1),
            f"the oldest due {kind[:-1]} in {lane} has waited {seconds:.0f} s",
        )
        for kind, lane, seconds in oldest
    ]


@shared_task(name="clarion.alerts")
def evaluate() -> dict[str, list[str]]:
    """Measure, open and clear; then post what the webhook has not taken. Returns what changed."""
    s = settings.get()
    now = clock.now()
    try:
        window: dict[str, tuple[int, int]] | None = sendrate.window(now, s.alert_window)
    except redis_lib.RedisError:  # no counts: the rate alerts stay as they are this time
        log.warning("send rates unreadable", exc_info=True, extra={"action": "alert_no_rates"})
        window = None
    with engine().begin() as conn:
        readings = stuck_readings(reports.oldest_due(conn, now), after=s.alert_stuck_after)
        if window is not None:
            open_rates = {a.subject for a in alerts.open_alerts(conn) if a.kind == RATE}
            readings += rate_readings(
                window, open_rates, share=s.alert_failure_share, min_sends=s.alert_min_sends
            )
        changed = apply(conn, readings, now=now)
    if s.alert_webhook_url:
        post_pending(s.alert_webhook_url, s.webhook_secret, s.webhook_timeout, now=now)
    return changed


def apply(conn: Connection, readings: list[Reading], *, now: datetime) -> dict[str, list[str]]:
    """Open the firing, clear the ended; each change logged with its action."""
    changed: dict[str, list[str]] = {"fired": [], "cleared": []}
    for r in readings:
        if r.firing:
            found = alerts.open_alert(
                conn, r.kind, r.subject, value=r.value, detail=r.detail, now=now
            )
            event = "fired"
        elif r.firing is False:
            found = alerts.clear_alert(conn, r.kind, r.subject, now=now)
            event = "cleared"
        else:
            continue
        if found is not None:
            changed[event].append(f"{r.kind}:{r.subject}")
            log.warning(
                "alert %s: %s %s — %s",
                event,
                r.kind,
                r.subject,
                r.detail,
                extra={"action": f"alert_{event}", "kind": r.kind, "subject": r.subject},
            )
    return changed


def payload(alert: Alert, event: str) -> bytes:
    """The pure part of a POST: what the alert webhook receives."""

    def iso(at: datetime | None) -> str | None:
        return at.isoformat() if at else None

    return json.dumps(
        {
            "alert_id": alert.id,
            "event": event,
            "kind": alert.kind,
            "subject": alert.subject,
            "value": alert.value,
            "detail": alert.detail,
            "opened_at": iso(alert.opened_at),
            "cleared_at": iso(alert.cleared_at),
        },
        separators=(",", ":"),
    ).encode()


def post_pending(url: str, secret: str, timeout: float, *, now: datetime) -> int:
    """POST each firing and clearing not yet taken (2xx); returns how many were. The receiver
    dedups on Idempotency-Key (`alert:<id>:<event>`): two evaluators may post one twice."""
    with engine().connect() as conn:
        pending = alerts.unposted(conn, since=now - POST_SINCE)
    http = urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout), retries=False)
    taken = 0
    for alert in pending:
        events = (["fired"] if alert.open_posted_at is None else []) + (
            ["cleared"] if alert.cleared_at is not None else []
        )
        for event in events:
            if _post(http, url, secret, alert, event):
                with engine().begin() as conn:
                    alerts.mark_posted(conn, alert.id, event, now=now)
                taken += 1
            else:
                break  # a clearing is not posted before its firing
    return taken


def _post(http: urllib3.PoolManager, url: str, secret: str, alert: Alert, event: str) -> bool:
    body = payload(alert, event)
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": f"alert:{alert.id}:{event}",
        "X-Clarion-Timestamp": timestamp,
        "X-Clarion-Signature": sign(secret, timestamp, body),
    }
    try:
        status = http.request("POST", url, body=body, headers=headers).status
    except urllib3.exceptions.HTTPError as exc:
        log.warning("alert webhook unreachable: %s", exc, extra={"action": "alert_post_failed"})
        return False
    if not 200 <= status < 300:
        log.warning("alert webhook answered %s", status, extra={"action": "alert_post_failed"})
    return 200 <= status < 300
