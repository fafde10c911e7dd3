"""Lane isolation in the beat tick: each lane has its own republish budget, transactional first, and
a row that keeps coming round waits twice as long each time."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.tasks import notify, register_recipient
from clarion.tasks.publish import ROUTE
from clarion.tasks.route import route
from clarion.tasks.tick import LANE_LIMIT, tick
from tests.support.pipeline import frozen_clock, published, publishing_to_this_tests_broker, rows

pytestmark = pytest.mark.integration

BACKLOG = 50_000


@pytest.fixture(autouse=True)
def _broker(clarion_env):
    with publishing_to_this_tests_broker():
        yield


def _activation_backlog(n: int) -> None:
    """n activation requests deferred (quiet hours, say) until a moment that has now come."""
    with engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,"
                " state, due_at, created_at)"
                " SELECT 'backlog', 'nudge', 'n' || g, 'activation', 1, '{\"name\": \"x\"}', 'deferred',"
                " now() - interval '1 second', now() FROM generate_series(1, :n) g"
            ),
            {"n": n},
        )


def test_a_fifty_thousand_row_activation_backlog_does_not_delay_transactional_outbox_rows(
    clarion_env,
):
    register_recipient("backlog", timezone="UTC")
    register_recipient("payer", timezone="UTC")
    _activation_backlog(BACKLOG)
    with engine().begin() as conn:  # outbox rows written in the app's own transaction
        receipts = [
            notify(
                "payer", "receipt", event_id=f"r{n}", variables={"order": str(n)}, connection=conn
            )
            for n in range(100)
        ]
    started = time.monotonic()
    taken = tick()
    elapsed = time.monotonic() - started

    routes = published("transactional")[ROUTE]
    assert sorted(routes) == sorted(
        ("payer", r.request_id) for r in receipts
    )  # all, in the first tick
    assert taken["requests"] == 100 + LANE_LIMIT  # the backlog gets its own budget, no more
    assert len(published("activation")[ROUTE]) == LANE_LIMIT
    assert route([u for u, _ in routes], [i for _, i in routes]) == 100
    print(f"\none tick over a {BACKLOG:,}-row activation backlog: {elapsed * 1000:.0f} ms")


def test_rows_that_keep_coming_round_back_off_exponentially(clarion_env):
    register_recipient("backlog", timezone="UTC")
    _activation_backlog(10)
    with frozen_clock() as clk:
        waits = []
        for _ in range(5):
            now = clk.now
            assert tick()["requests"] == 10
            [row] = rows("SELECT max(due_at) AS due, max(rounds) AS rounds FROM requests")
            waits.append(round((row["due"] - now).total_seconds()))
            clk.advance(waits[-1] + 0.001)
        assert waits == [30, 60, 120, 240, 300]  # CLARION_STRAY_AFTER doubling, up to the cap
        assert tick()["requests"] == 10 and row["rounds"] == 5
        clk.advance(timedelta(seconds=1).total_seconds())
        assert tick()["requests"] == 0
