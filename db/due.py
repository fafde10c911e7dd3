"""What the beat tick has to do, in one read: an idle tick asks this and nothing else.

Each flag reads the partial index the matching take uses (series_due, requests_due,
deliveries_due, receipts_early, escalations_due, collapse_refreshes_due, broadcasts_due), with the
take's own predicate or a wider one, never a narrower one: a false flag must mean that step would
have taken nothing. The tick then runs only the steps whose flag is set (tasks/tick.py).

On the tables that grow with history the flag is "the first row in the index's order" (ORDER BY
its key, LIMIT 1), not EXISTS: PostgreSQL drops an EXISTS subquery's ORDER BY, and with statistics
taken while many rows were due (a young ledger with a backlog, analyzed before a bulk load) it
costs a sequential scan that stops at the first match as cheap, and then reads every row when
none is due: 1.3 s a tick at 2 M deliveries (bench/history.py). In index order the first row is
one index probe whatever the statistics say.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text


@dataclass(frozen=True)
class Due:
    series: bool
    requests: frozenset[str]  # lanes with requests due
    deliveries: frozenset[str]  # lanes with deliveries due
    early_receipts: bool
    escalations: bool
    refreshes: bool
    broadcasts: bool

    @property
    def anything(self) -> bool:
        return bool(
            self.series
            or self.requests
            or self.deliveries
            or self.early_receipts
            or self.escalations
            or self.refreshes
            or self.broadcasts
        )


def _first(table: str, where: str, key: str) -> str:
    """Whether `table` has a row matching `where`, read as its first row in `key` order."""
    return f"(SELECT {key} FROM {table} WHERE {where} ORDER BY {key} LIMIT 1) IS NOT NULL"


def _lane_flags(table: str, lanes: tuple[str, ...]) -> str:
    return ",\n".join(
        _first(table, f"lane = '{lane}' AND due_at <= :now", "due_at") + f" AS {table}_{lane}"
        for lane in lanes
    )


def _probe(lanes: tuple[str, ...]) -> str:
    return f"""
    SELECT
      {_first("series", "state = 'active' AND next_due_at <= :now", "next_due_at")} AS series,
      {_lane_flags("requests", lanes)},
      {_lane_flags("deliveries", lanes)},
      {_first("receipts", "outcome = 'early'", "received_at")} AS early_receipts,
      EXISTS (SELECT 1 FROM escalations WHERE state = 'waiting' AND due_at <= :now) AS escalations,
      EXISTS (SELECT 1 FROM collapse_refreshes WHERE due_at IS NOT NULL AND due_at <= :now)
        AS refreshes,
      EXISTS (SELECT 1 FROM broadcasts WHERE due_at <= :now) AS broadcasts
    """


_PROBES: dict[tuple[str, ...], str] = {}


def what_is_due(conn: Connection, *, now: datetime, lanes: tuple[str, ...]) -> Due:
    """The tick's steps that have work at `now` (lanes are identifiers of ours, never input)."""
    if lanes not in _PROBES:
        _PROBES[lanes] = _probe(lanes)
    row = conn.execute(text(_PROBES[lanes]), {"now": now}).mappings().one()
    return Due(
        series=row["series"],
        requests=frozenset(lane for lane in lanes if row[f"requests_{lane}"]),
        deliveries=frozenset(lane for lane in lanes if row[f"deliveries_{lane}"]),
        early_receipts=row["early_receipts"],
        escalations=row["escalations"],
        refreshes=row["refreshes"],
        broadcasts=row["broadcasts"],
    )
