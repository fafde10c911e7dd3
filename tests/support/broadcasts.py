"""Helpers for broadcast tests: the broadcast catalog, audiences made in bulk, and an in-process
worker loop that runs what the code published (fan-out, route, deliver) until nothing is left."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.tasks.audiences import MAX_IDS, subscribe
from clarion.tasks.broadcasts import FAN_OUT, fan_out_task
from clarion.tasks.deliver import deliver
from clarion.tasks.publish import DELIVER, ROUTE
from clarion.tasks.route import route
from tests.support.environment import ROOT, reset_process_state
from tests.support.pipeline import drain

CATALOG = ROOT / "tests" / "catalog_broadcasts.yaml"
LANES = ("transactional", "activation")
TASKS = {FAN_OUT: fan_out_task, ROUTE: route, DELIVER: deliver}


def use_broadcast_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLARION_CATALOG", str(CATALOG))
    reset_process_state()


def recipients(
    prefix: str,
    n: int,
    *,
    country: str = "US",
    zone: str = "America/New_York",
    locale: str = "en",
) -> list[str]:
    """n registered recipients `<prefix>00000`… in one statement (setup, not under test)."""
    with engine().begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO recipients (user_id, timezone, locale, country, addresses, created_at,
                                        updated_at)
                SELECT :prefix || lpad(g::text, 6, '0'), :zone, :locale, :country, '{}', now(),
                       now()
                FROM generate_series(0, :n - 1) g
                """
            ),
            {"prefix": prefix, "n": n, "zone": zone, "locale": locale, "country": country},
        )
    return [f"{prefix}{g:06d}" for g in range(n)]


def join(topic: str, users: Iterable[str]) -> int:
    """Subscribe users to a topic through subscribe(), MAX_IDS at a time."""
    listed, added = list(users), 0
    for start in range(0, len(listed), MAX_IDS):
        added += subscribe(topic, listed[start : start + MAX_IDS])
    return added


def work(rounds: int = 100) -> dict[str, int]:
    """Run every fan-out, route and deliver message waiting in the lane queues, in this process,
    until none is left; how many messages of each task ran."""
    ran = {name: 0 for name in TASKS}
    for _ in range(rounds):
        messages = [m for lane in LANES for m in drain(lane)]
        if not messages:
            return ran
        for name, users, ids in messages:
            TASKS[name](users, ids)
            ran[name] += 1
    raise AssertionError(f"work still waiting after {rounds} rounds: {ran}")
