"""Named statements for the gates: the snapshot, the channel gates' rows (preferences and the
suppression list), deferring a request and folding one into a summary.

The activation window, fatigue caps and collapse gates keep their own snapshot query and claim in
db/activation_windows.py, db/fatigue_counters.py and db/collapse_groups.py; `snapshot_rows` runs
them with the others, so a snapshot stays six queries whatever the number of recipients.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from clarion import hashing, settings
from clarion.db import activation_windows, collapse_groups, fatigue_counters
from clarion.db.ledger import THESE_USERS
from clarion.rows import (
    CollapseGroup,
    FatigueCount,
    HashedSuppression,
    OpenWindow,
    Preference,
    Suppression,
)

# Joined with the arrays, not `= ANY(:users)`: a prepared statement's generic plan walks the array
# for every row it reads (db/ledger.py, THESE_USERS, has the measurements).
_PREFERENCES = text(f"SELECT user_id, scope, key, channel, enabled FROM preferences {THESE_USERS}")
_SUPPRESSIONS = text(f"SELECT user_id, channel, address, reason FROM suppressions {THESE_USERS}")
# Suppressions of these addresses recorded for anyone (a bounce under another user, an erased
# recipient's row), by the keyed hashes of the addresses about to be used: index
# suppressions_address (channel, address_hash); with hash partitioning, one probe per partition.
_HASHED_SUPPRESSIONS = text(
    "SELECT user_id, channel, address_hash, reason, detail, created_at FROM suppressions "
    "JOIN unnest(CAST(:channels AS text[])) AS c(channel) USING (channel) "
    "JOIN unnest(CAST(:hashed AS text[])) AS h(address_hash) USING (address_hash) "
    "ORDER BY created_at, user_id"
)


@dataclass(frozen=True)
class SnapshotRows:
    """What the gates read about a batch of recipients, as rows (gates.apply groups them into
    one Snapshot per recipient)."""

    preferences: dict[str, list[Preference]]  # by user
    suppressions: list[Suppression]  # listed for these users
    hashed_suppressions: list[HashedSuppression]  # their addresses, listed for anyone
    windows: list[OpenWindow]
    counters: list[FatigueCount]
    collapses: list[CollapseGroup]


def snapshot_rows(
    conn: Connection,
    users: Iterable[str],
    scopes: Iterable[str],
    *,
    now: datetime,
    hashed: Iterable[tuple[str, str]] = (),
) -> SnapshotRows:
    """Everything the gates read about these recipients, in six indexed queries (`hashed`:
    (channel, keyed hash) of their addresses, matched against everyone's suppressions)."""
    pairs = set(hashed)
    params = {
        "users": list(set(users)),
        "now": now,
        "scopes": list(set(scopes)),
        "channels": sorted({channel for channel, _ in pairs}),
        "hashed": sorted({digest for _, digest in pairs}),
    }
    return SnapshotRows(
        preferences=_preferences(conn, params),
        suppressions=[Suppression.from_row(r) for r in conn.execute(_SUPPRESSIONS, params)],
        hashed_suppressions=[
            HashedSuppression.from_row(r) for r in conn.execute(_HASHED_SUPPRESSIONS, params)
        ]
        if params["hashed"]
        else [],
        windows=activation_windows.open_windows(conn, params),
        counters=fatigue_counters.live_counters(conn, params),
        collapses=collapse_groups.open_groups(conn, params),
    )


def preferences_of(conn: Connection, users: Iterable[str]) -> dict[str, list[Preference]]:
    """The settings of these recipients, by user (one with none is absent)."""
    return _preferences(conn, {"users": list(set(users))})


def _preferences(conn: Connection, params: dict[str, object]) -> dict[str, list[Preference]]:
    found: defaultdict[str, list[Preference]] = defaultdict(list)
    for user_id, *setting in conn.execute(_PREFERENCES, params):
        found[user_id].append(Preference.from_row(setting))
    return dict(found)


_DEFER = text(
    "UPDATE requests SET state = 'deferred', due_at = :until, routed_at = NULL "
    "WHERE user_id = :user_id AND id = :id AND state = 'routed'"
)


def defer_request(conn: Connection, key: tuple[str, int], *, until: datetime) -> None:
    """Hand a request back to the beat tick, to be routed again at `until`."""
    conn.execute(_DEFER, {"user_id": key[0], "id": key[1], "until": until})


_FOLD = text(
    """
    INSERT INTO requests AS r (user_id, type_key, occurrence_key, lane, template_version, variables,
                               state, due_at, created_at)
    VALUES (:user_id, :type_key, :occ, :lane, :version,
            jsonb_build_object('count', 1, 'types', jsonb_build_array(CAST(:folded AS text))),
            'deferred', :due_at, :now)
    ON CONFLICT (user_id, type_key, occurrence_key) DO UPDATE SET
        variables = jsonb_build_object(
            'count', (r.variables->>'count')::int + 1,
            'types', CASE WHEN r.variables->'types' ? CAST(:folded AS text) THEN r.variables->'types'
                          ELSE r.variables->'types' || to_jsonb(CAST(:folded AS text)) END)
        WHERE r.state IN ('deferred', 'pending')
    RETURNING id
    """
)


def fold_into_summary(
    conn: Connection,
    user_id: str,
    *,
    summary_type: str,
    occurrence_key: str,
    lane: str,
    version: int,
    folded_type: str,
    due_at: datetime,
    now: datetime,
) -> int | None:
    """Count a folded request in the recipient's summary request (created deferred until due_at)."""
    row = conn.execute(
        _FOLD,
        {
            "user_id": user_id,
            "type_key": summary_type,
            "occ": occurrence_key,
            "lane": lane,
            "version": version,
            "folded": folded_type,
            "due_at": due_at,
            "now": now,
        },
    ).first()
    return row[0] if row else None


# --- preferences and the suppression list -----------------------------------------------------

_SET_PREFERENCE = text(
    """
    INSERT INTO preferences (user_id, scope, key, channel, enabled, updated_at)
    VALUES (:user_id, :scope, :key, :channel, :enabled, :now)
    ON CONFLICT (user_id, scope, key, channel) DO UPDATE
        SET enabled = excluded.enabled, updated_at = excluded.updated_at
    """
)
_CLEAR_PREFERENCE = text(
    "DELETE FROM preferences WHERE user_id = :user_id AND scope = :scope AND key = :key AND channel = :channel"
)


def set_preferences(
    conn: Connection,
    user_id: str,
    rows: Iterable[tuple[str, str, str, bool | None]],
    *,
    now: datetime,
) -> None:
    """Upsert (scope, key, channel, enabled) rows; enabled=None removes the setting."""
    for scope, key, channel, enabled in rows:
        params = {
            "user_id": user_id,
            "scope": scope,
            "key": key,
            "channel": channel,
            "enabled": enabled,
            "now": now,
        }
        conn.execute(_CLEAR_PREFERENCE if enabled is None else _SET_PREFERENCE, params)


_SUPPRESS = text(
    """
    INSERT INTO suppressions (user_id, channel, address, reason, detail, created_at, address_hash)
    VALUES (:user_id, :channel, :address, :reason, :detail, :now, :address_hash)
    ON CONFLICT (user_id, channel, address) DO NOTHING
    """
)


def suppress_address(
    conn: Connection,
    user_id: str,
    *,
    channel: str,
    address: str,
    reason: str,
    detail: str,
    now: datetime,
) -> None:
    """Put an address on the permanent suppression list (bounce, complaint, STOP, deactivated),
    for every recipient who has it: the row carries the address's keyed hash, which the gate
    looks up whoever holds the address."""
    key = hashing.address_key(settings.get())
    conn.execute(
        _SUPPRESS,
        {
            "user_id": user_id,
            "channel": channel,
            "address": address,
            "address_hash": hashing.hashed(key, channel, address),
            "reason": reason,
            "detail": detail,
            "now": now,
        },
    )


def forget_address(
    conn: Connection, user_id: str, *, channel: str, value: str, now: datetime
) -> bool:
    """Remove one value from a recipient's address for `channel` (a push token from the
    space-separated device list; the whole address when it is the only value). False if absent."""
    row = conn.execute(
        text("SELECT addresses ->> :channel FROM recipients WHERE user_id = :u FOR UPDATE"),
        {"u": user_id, "channel": channel},
    ).first()
    if row is None or row[0] is None:
        return False
    values = row[0].split()
    if value not in values:
        return False
    kept = " ".join(v for v in values if v != value)
    conn.execute(
        text(
            """
            UPDATE recipients SET updated_at = :now, addresses = CASE
                WHEN :kept = '' THEN addresses - :channel
                ELSE jsonb_set(addresses, ARRAY[:channel], to_jsonb(CAST(:kept AS text))) END
            WHERE user_id = :u
            """
        ),
        {"u": user_id, "channel": channel, "kept": kept, "now": now},
    )
    return True
