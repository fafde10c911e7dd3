"""`clarion broadcasts` (progress, cancel) and `clarion broadcast` (start or dry-run one)."""

from __future__ import annotations

import json
from typing import Any

from clarion.db import broadcasts as db
from clarion.db.engine import engine
from clarion.errors import InvalidRequest
from clarion.ops.table import render
from clarion.tasks import broadcasts


def listing(limit: int = 20) -> str:
    """The most recent broadcasts, newest first: state, counters, and what became of their
    requests (sent, waiting, suppressed by reason)."""
    with engine().connect() as conn:
        found = [(b, db.outcomes(conn, b)) for b in db.recent(conn, limit)]
    return render(
        [
            "id",
            "type",
            "state",
            "at",
            "planned",
            "skipped",
            "requested",
            "sent",
            "waiting",
            "suppressed",
            "created (UTC)",
        ],
        [
            (
                b.id,
                b.type_key,
                b.state,
                b.at_local.strftime("%H:%M local") if b.at_local else "now",
                b.planned,
                b.skipped,
                b.requested,
                o.sent,
                o.waiting,
                _reasons(o.suppressed),
                b.created_at.strftime("%Y-%m-%d %H:%M"),
            )
            for b, o in found
        ],
        "broadcasts:",
    )


def _reasons(suppressed: dict[str, int]) -> str:
    """`opted_out=2 quiet_hours=1` (or 0): one cell of the listing."""
    return " ".join(f"{r}={n}" for r, n in sorted(suppressed.items())) or "0"


def detail(broadcast_id: int) -> str:
    """One broadcast's progress: counters, what became of its requests, suppressions by reason."""
    shown = broadcasts.broadcast_progress(broadcast_id).as_json()
    suppressed = shown.pop("suppressed")
    rows: list[tuple[str, Any]] = [
        (k, json.dumps(v) if isinstance(v, dict) else v) for k, v in shown.items()
    ]
    rows += [(f"suppressed: {reason}", n) for reason, n in suppressed.items()]
    return render(["", ""], rows, f"broadcast {broadcast_id}:")


def audience(topic: str | None, segment: list[str] | None) -> dict[str, Any]:
    """--topic T and --segment field=value (repeatable; values of one field add up)."""
    fields: dict[str, list[str]] = {}
    for pair in segment or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"--segment takes field=value, not {pair!r}")
        fields.setdefault(name, []).append(value)
    chosen: dict[str, Any] = {"segment": fields} if fields else {}
    if topic is not None:
        chosen["topic"] = topic
    return chosen


def dry_run_table(plan: broadcasts.DryRun) -> str:
    shown = plan.as_json()
    rows: list[tuple[str, Any]] = [
        ("planned", shown["planned"]),
        ("skipped (local time passed)", shown["skipped"]),
        ("would deliver", shown["deliver"]),
    ]
    rows += [(f"channel: {c}", n) for c, n in shown["by_channel"].items()]
    rows += [(f"not sent: {r}", n) for r, n in shown["by_reason"].items()]
    return render(["", "recipients"], rows, "dry run (nothing written):")
