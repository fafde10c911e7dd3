"""`clarion suppressions list|lift`: read the permanent suppression list and lift an entry.

A lift is audited in `suppression_lifts` (who, when, why, and the entry as it was); `list --lifted`
shows that log. After a lift the address is used again from the next routed request on."""

from __future__ import annotations

import getpass

from clarion import clock
from clarion import validation as check
from clarion.db import suppressions
from clarion.db.engine import engine
from clarion.errors import InvalidField, InvalidRequest
from clarion.ops.table import render

WHY_BYTES = 2000


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def listing(
    *,
    user_id: str | None,
    channel: str | None,
    address: str | None,
    lifted: bool,
    limit: int,
) -> str:
    """The entries (or, with `lifted`, the audit log of lifts) matching every filter given."""
    if limit < 1:
        raise InvalidRequest(f"--limit must be a positive whole number, not {limit}")
    with engine().connect() as conn:
        if lifted:
            lifts = suppressions.list_lifts(
                conn, user_id=user_id, channel=channel, address=address, limit=limit
            )
            return _lifts_table(lifts)
        listed = suppressions.list_suppressions(
            conn, user_id=user_id, channel=channel, address=address, limit=limit
        )
    return render(
        ["since (UTC)", "user", "channel", "address", "reason", "detail"],
        [
            (_when(s.created_at), s.user_id, s.channel, s.address, s.reason, s.detail)
            for s in listed
        ],
        "on the suppression list, newest first:",
    )


def _lifts_table(lifts: list[suppressions.Lift]) -> str:
    return render(
        ["lifted (UTC)", "by", "why", "user", "channel", "address", "reason", "listed (UTC)"],
        [
            (
                _when(x.lifted_at),
                x.lifted_by,
                x.why,
                x.user_id or "",
                x.channel,
                x.address,
                x.reason,
                _when(x.suppressed_at),
            )
            for x in lifts
        ],
        "lifted suppressions, most recent first:",
    )


def lift(
    user_id: str | None, channel: str, address: str, *, why: str, by: str | None = None
) -> str:
    """Lift the address for everyone in one transaction, an audit row per entry; InvalidRequest if
    it is not listed (for `user_id`, when given)."""
    why = why.strip()
    if not why:
        raise InvalidField("--reason", "say why the entry is lifted (it is kept in the audit log)")
    why = check.text("--reason", why, max_bytes=WHY_BYTES)
    by = check.text("--by", (by or getpass.getuser()).strip() or "unknown", max_bytes=200)
    with engine().begin() as conn:
        done = suppressions.lift(
            conn,
            user_id=user_id,
            channel=channel,
            address=address,
            by=by,
            why=why,
            now=clock.now(),
        )
    if not done:
        whose = "" if user_id is None else f" for user {user_id!r}"
        raise InvalidRequest(
            f"no suppression{whose} on {channel} address {address!r} "
            "(see `clarion suppressions list`)"
        )
    return "\n".join(
        f"lifted: {channel} address {address} of {d.user_id} (was {d.reason}, listed "
        f"{_when(d.suppressed_at)} UTC) by {d.lifted_by} at {_when(d.lifted_at)} UTC"
        for d in done
    )
