"""Helpers for the gate tests: the gate catalog, a virtual clock, and the rows one request left."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from clarion import clock
from clarion.db.engine import engine
from tests.support.environment import ROOT, reset_process_state

GATES = ROOT / "tests" / "catalog_gates.yaml"

_events = itertools.count()


def use_gates_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point this process (and the children it starts with os.environ) at the gate catalog."""
    monkeypatch.setenv("CLARION_CATALOG", str(GATES))
    reset_process_state()


class VirtualClock:
    """clarion.clock driven by the test; `close()` restores the system clock."""

    def __init__(self, start: datetime) -> None:
        self.now = start
        clock.set_source(lambda: self.now)

    def set(self, when: datetime) -> datetime:
        self.now = when
        return when

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now

    def close(self) -> None:
        clock.set_source(None)


def fresh_event() -> str:
    return f"ev-{next(_events)}"


def rows(sql: str, **params: Any) -> list[tuple]:
    with engine().connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def one(sql: str, **params: Any) -> Any:
    with engine().connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def decisions_of(user_id: str, request_id: int) -> list[tuple]:
    """(gate, outcome, reason, channel, detail) recorded for one request, in the order written."""
    return rows(
        "SELECT gate, outcome, reason, channel, detail FROM decisions "
        "WHERE user_id = :u AND request_id = :r ORDER BY id",
        u=user_id,
        r=request_id,
    )


def deliveries_of(user_id: str, request_id: int) -> list[tuple]:
    """(channel, not_before, state) of one request's deliveries."""
    return rows(
        "SELECT channel, not_before, state FROM deliveries "
        "WHERE user_id = :u AND request_id = :r ORDER BY channel",
        u=user_id,
        r=request_id,
    )


def request_row(user_id: str, request_id: int) -> dict[str, Any]:
    with engine().connect() as conn:
        return dict(
            conn.execute(
                text("SELECT * FROM requests WHERE user_id = :u AND id = :r"),
                {"u": user_id, "r": request_id},
            )
            .mappings()
            .one()
        )


def gate_state() -> dict[str, int]:
    """Every row the gates and the ledger can write, summed: compare around a call that must write nothing."""
    return dict(
        zip(
            (
                "requests",
                "deliveries",
                "decisions",
                "windows",
                "caps",
                "collapses",
                "preferences",
                "suppressions",
            ),
            rows("""SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM deliveries),
                       (SELECT count(*) FROM decisions), (SELECT count(*) FROM activation_windows),
                       (SELECT coalesce(sum(count), 0) FROM fatigue_counters),
                       (SELECT coalesce(sum(count), 0) FROM collapse_groups),
                       (SELECT count(*) FROM preferences), (SELECT count(*) FROM suppressions)""")[
                0
            ],
            strict=True,
        )
    )


def summaries(user_id: str) -> list[dict[str, Any]]:
    """The recipient's daily_summary requests: occurrence key, state, due time and variables."""
    with engine().connect() as conn:
        return [
            dict(r)
            for r in conn.execute(
                text(
                    "SELECT occurrence_key, state, due_at, variables FROM requests "
                    "WHERE user_id = :u AND type_key = 'daily_summary' ORDER BY id"
                ),
                {"u": user_id},
            ).mappings()
        ]


def send_and_route(
    user_id: str,
    type_key: str,
    variables: Mapping[str, Any] | None = None,
    event_id: str | None = None,
) -> int:
    """notify() then route() in-process at the clock's current time; returns the request id."""
    from clarion.tasks import notify
    from clarion.tasks.route import route

    request = notify(user_id, type_key, event_id=event_id or fresh_event(), variables=variables)
    route([user_id], [request.request_id])
    return request.request_id


# Labels for some of the gate catalog's types (the rest read as their keys)
PAGE_LABELS = {
    "receipt": {"label": "Order receipts", "description": "A receipt for each order you place."},
    "stalled_plan": {
        "label": "A quiet growth plan",
        "description": "A reminder when your plan has had no activity for a while.",
        "locales": {"de": {"label": "Ein ruhiger Wachstumsplan"}},
    },
    "tip": {"label": "Weekly tips"},
}


def page_catalog() -> dict[str, Any]:
    """The gate catalog as the preferences page sees a real one: every type also on `in_app` (a
    channel a recipient may choose), some types labelled (PAGE_LABELS)."""
    spec = yaml.safe_load(GATES.read_text())
    for key, ntype in spec["types"].items():
        ntype["channels"] = ["in_app", *ntype["channels"]]
        ntype.update(PAGE_LABELS.get(key, {}))
    return spec


def use_page_catalog(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """Point this process at page_catalog(), written to `folder`."""
    path = folder / "catalog_page.yaml"
    path.write_text(yaml.safe_dump(page_catalog(), sort_keys=False))
    monkeypatch.setenv("CLARION_CATALOG", str(path))
    reset_process_state()
    return path
