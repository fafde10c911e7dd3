"""Fake route-path rows for unit tests, built from the records db/ returns (clarion.rows): a field
the database returns and a test leaves out is a TypeError here, not a shape that drifts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from clarion.rows import CollapseGroup, DraftRequest, OpenWindow, Recipient


def recipient(**overrides: Any) -> Recipient:
    """A recipient in UTC with no addresses, settings or calendar of their own, but `overrides`."""
    base = Recipient(
        user_id="u1",
        timezone="UTC",
        locale="en",
        country=None,
        org_id=None,
        addresses={},
        quiet_start=None,
        quiet_end=None,
        workweek=None,
        subdivision=None,
    )
    return replace(base, **overrides)


def request(
    type_key: str,
    *,
    id: int | None = 1,
    user_id: str = "u1",
    variables: Mapping[str, Any] | None = None,
    occurrence_key: str = "event:e1",
) -> DraftRequest:
    """A request as the planner sees it (the fields every gate may read)."""
    return DraftRequest(user_id, id, type_key, occurrence_key, dict(variables or {}))


def window(until: datetime, type_key: str, *, user_id: str = "u1") -> OpenWindow:
    """An open activation window in a recipient's snapshot."""
    return OpenWindow(user_id, until, type_key)


def group(
    key: str, leader_id: int, until: datetime, count: int, *, user_id: str = "u1"
) -> dict[str, CollapseGroup]:
    """A snapshot's collapses holding one open group (`Snapshot(collapses=group(...))`)."""
    return {key: CollapseGroup(user_id, key, leader_id, until, count)}
