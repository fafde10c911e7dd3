"""The activity page's search by request id or by the app's event id, without a user id, is an
index probe (requests_id, requests_occurrence: migration 0028), not a read of `requests` whole:
the plans PostgreSQL picks for db/activity.py's own statements over 20,000 requests of 200
recipients, analyzed. Without those indexes each plan is a sequential scan, and this fails."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import text

from clarion.db import activity
from clarion.db.engine import engine

pytestmark = pytest.mark.integration
USERS, PER_USER = 200, 100


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def _plan(statement: Any, **params: object) -> list[dict[str, Any]]:
    with engine().connect() as conn:
        [[document]] = conn.execute(text("EXPLAIN (FORMAT JSON) " + statement.text), params)
    return _nodes(document[0]["Plan"])


@pytest.fixture
def many_requests(clarion_env) -> None:
    with engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO recipients (user_id, timezone, created_at, updated_at) "
                "SELECT 'u' || g, 'UTC', now(), now() FROM generate_series(1, :users) g"
            ),
            {"users": USERS},
        )
        conn.execute(
            text(
                "INSERT INTO requests (user_id, type_key, occurrence_key, lane, "
                "template_version, variables, state, created_at) "
                "SELECT 'u' || (g % :users + 1), 'receipt', 'event:e' || g, 'transactional', 1, "
                "'{}', 'routed', now() FROM generate_series(1, :n) g"
            ),
            {"users": USERS, "n": USERS * PER_USER},
        )
    with engine().connect() as conn:
        conn.execute(text("ANALYZE requests"))
        conn.commit()


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        (activity._BY_REQUEST_ID, {"id": 12345}),
        (activity._BY_EVENT_ID, {"key": "event:e12345"}),
    ],
    ids=["request id", "event id"],
)
def test_a_search_without_a_user_id_probes_an_index(many_requests, statement, params):
    nodes = _plan(statement, user_id=None, limit=activity.MAX_MATCHES, **params)
    scans = [(n["Node Type"], n.get("Index Name", n.get("Relation Name"))) for n in nodes]
    assert not [s for s in scans if s[0] == "Seq Scan"], scans
    indexes = {name for kind, name in scans if "Index" in kind}
    own = "requests_id" if "id" in params else "requests_occurrence"
    # the index itself, or on the hash-partitioned layout its copy on each partition (<index>_pN)
    assert indexes and all(re.fullmatch(rf"{own}(_p\d+)?", n) for n in indexes), scans


def test_the_search_finds_the_request_it_probes_for(many_requests):
    with engine().connect() as conn:
        by_id = activity.find_users(conn, request_id=12345)
        by_event = activity.find_users(conn, event_id="e12345")
    assert len(by_id) == 1 and len(by_id[0].request_ids) == 1
    assert [m.request_ids for m in by_event] == [by_id[0].request_ids]
