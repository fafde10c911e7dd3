"""Named statements for the fatigue caps gate (gates/fatigue_caps.py): the counters of many scopes,
for the snapshot, and the claim of one slot under a cap (one conditional upsert: of concurrent
claimers, the database picks the winner).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from clarion.rows import FatigueCount

_COUNTERS = text(
    "SELECT scope, bucket, count FROM fatigue_counters "
    "JOIN unnest(CAST(:scopes AS text[])) AS these(scope) USING (scope) WHERE expires_at > :now"
)


def live_counters(conn: Connection, params: Mapping[str, Any]) -> list[FatigueCount]:
    """The unexpired counters of `params["scopes"]` at `params["now"]`."""
    return [FatigueCount.from_row(r) for r in conn.execute(_COUNTERS, params)]


_CLAIM_CAP = text(
    """
    INSERT INTO fatigue_counters AS c (scope, bucket, count, expires_at)
    VALUES (:scope, :bucket, 1, :expires_at)
    ON CONFLICT (scope, bucket) DO UPDATE SET count = c.count + 1 WHERE c.count < :limit
    RETURNING count
    """
)


def claim_cap(
    conn: Connection, *, scope: str, bucket: str, limit: int, expires_at: datetime
) -> bool:
    """Take one slot under a fatigue cap; False when the cap is reached."""
    return (
        conn.execute(
            _CLAIM_CAP, {"scope": scope, "bucket": bucket, "limit": limit, "expires_at": expires_at}
        ).first()
        is not None
    )
