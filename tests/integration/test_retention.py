"""Retention (tasks/retention.py): finished rows past the horizon go, in bounded batches, driven by
the injected clock; nothing open, claimed or unknown, and no occurrence of a live series, goes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from clarion import celeryconfig
from clarion.db.engine import engine
from clarion.tasks.retention import remove_old
from clarion.tasks.series import cancel_series, snooze_occurrence
from tests.support.pipeline import count, frozen_clock

pytestmark = pytest.mark.integration

NOW = datetime(2027, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=91)  # past the default 90 days
YOUNG = NOW - timedelta(days=89)


def _sql(sql: str, **params) -> list:
    with engine().begin() as conn:
        result = conn.execute(text(sql), params)
        return result.all() if result.returns_rows else []  # type: ignore[return-value]


def _request(user: str, occ: str, *, at: datetime, state: str = "routed") -> int:
    return _sql(
        "INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,"
        " state, created_at, routed_at) VALUES (:u, 'nudge', :o, 'activation', 1, '{}', :s, :at,"
        " CASE WHEN :s = 'routed' THEN CAST(:at AS timestamptz) END) RETURNING id",
        u=user,
        o=occ,
        s=state,
        at=at,
    )[0][0]


def _delivery(user: str, request_id: int, state: str, *, at: datetime) -> None:
    _sql(
        "INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel, one_platform,"
        " lane, state, platform, claim_token, lease_until, not_before, created_at, updated_at)"
        " SELECT :u, :r, type_key, occurrence_key, 'slack', true, lane, :s,"
        " CASE WHEN :s IN ('sent', 'unknown') THEN 'slack' END,"
        " CASE WHEN :s = 'claimed' THEN gen_random_uuid() END,"
        " CASE WHEN :s = 'claimed' THEN CAST(:at AS timestamptz) END, :at, :at, :at"
        " FROM requests WHERE user_id = :u AND id = :r",
        u=user,
        r=request_id,
        s=state,
        at=at,
    )
    _sql(
        "INSERT INTO decisions (user_id, request_id, gate, outcome, reason, decided_at)"
        " VALUES (:u, :r, 'prefs', 'allow', 'ok', :at)",
        u=user,
        r=request_id,
        at=at,
    )


def _series(user: str, key: str) -> int:
    return _sql(
        "INSERT INTO series (user_id, series_key, type_key, anchor_local, zone, every,"
        " calendar_policy, variables, state, next_n, next_due_at, created_at, updated_at)"
        " VALUES (:u, :k, 'nudge', CAST(:a AS timestamp), 'UTC', '1w', 'send', '{}', 'active', 20,"
        " :due, :a, :a) RETURNING id",
        u=user,
        k=key,
        a=OLD - timedelta(days=30),
        due=NOW + timedelta(days=1),
    )[0][0]


def _exists(table: str, user: str, id_: int) -> bool:
    return count(table, "user_id = :u AND id = :i", u=user, i=id_) == 1


def test_finished_rows_past_the_horizon_go_and_nothing_open_does(clarion_env):
    _sql(
        "INSERT INTO recipients (user_id, timezone, created_at, updated_at)"
        " VALUES ('ann', 'UTC', :at, :at)",
        at=OLD,
    )
    done = _request("ann", "e-done", at=OLD)
    _delivery("ann", done, "sent", at=OLD)
    kept = {  # each of these must survive the run
        "unknown": _request("ann", "e-unknown", at=OLD),
        "claimed": _request("ann", "e-claimed", at=OLD),
        "pending delivery": _request("ann", "e-pending", at=OLD),
        "not yet routed": _request("ann", "e-deferred", at=OLD, state="deferred"),
        "young": _request("ann", "e-young", at=YOUNG),
    }
    _delivery("ann", kept["unknown"], "unknown", at=OLD)
    _delivery("ann", kept["claimed"], "claimed", at=OLD)
    _delivery("ann", kept["pending delivery"], "pending", at=OLD)
    live = _series("ann", "weekly")
    ended = _series("ann", "stopped")
    kept["live series"] = _request("ann", f"series:{live}:3", at=OLD)
    gone_occurrence = _request("ann", f"series:{ended}:3", at=OLD)
    assert cancel_series("ann", ended)
    _sql(
        "INSERT INTO alerts (kind, subject, opened_at, cleared_at, value) VALUES"
        " ('stuck_work', 'a', :old, :old, 1), ('stuck_work', 'b', :old, NULL, 1)",
        old=OLD,
    )
    _sql(
        "INSERT INTO fatigue_counters VALUES ('org:acme', 'h1', 3, :past), ('org:acme', 'h2', 1, :future)",
        past=NOW - timedelta(hours=1),
        future=NOW + timedelta(hours=1),
    )

    with frozen_clock(NOW):
        removed = remove_old()

    assert removed["requests"] == 2 and removed["alerts"] == 1 and removed["fatigue_counters"] == 1
    assert not _exists("requests", "ann", done) and not _exists("requests", "ann", gone_occurrence)
    assert count("deliveries", "request_id = :r", r=done) == 0
    assert count("decisions", "request_id = :r", r=done) == 0
    for why, request_id in kept.items():
        assert _exists("requests", "ann", request_id), why
    assert count("deliveries") == 3 and count("decisions") == 3  # the kept requests' own
    assert count("alerts", "cleared_at IS NULL") == 1 == count("alerts")
    # the live series' old occurrence is still there, so snoozing it cannot create it again
    assert not snooze_occurrence("ann", live, 3, NOW + timedelta(hours=1))
    assert count("requests", "occurrence_key = :o", o=f"series:{live}:3") == 1
    with frozen_clock(NOW):
        assert not any(remove_old().values())  # a second run finds nothing more


def test_a_backlog_goes_in_bounded_batches_over_several_runs(clarion_env, monkeypatch):
    _sql(
        "INSERT INTO recipients (user_id, timezone, created_at, updated_at)"
        " VALUES ('bob', 'UTC', :at, :at)",
        at=OLD,
    )
    for n in range(5):
        _delivery("bob", _request("bob", f"e{n}", at=OLD), "sent", at=OLD)
    monkeypatch.setenv("CLARION_RETENTION_BATCH", "2")
    from clarion import settings

    settings.reset()
    with frozen_clock(NOW):
        assert remove_old(max_batches=1)["requests"] == 2
        assert count("requests") == 3
        assert remove_old(max_batches=2)["requests"] == 3  # the second batch of 1 ends the run
    assert count("requests") == 0 and count("deliveries") == 0


def test_inbox_items_go_after_their_own_keep_days(clarion_env, monkeypatch):
    monkeypatch.setenv("CLARION_INBOX_KEEP_DAYS", "30")
    from clarion import settings

    settings.reset()
    for day, delivery in ((31, 1), (29, 2)):
        _sql(
            "INSERT INTO inbox_items (user_id, delivery_id, type_key, rev, created_rev, wxid,"
            " created_at, updated_at) VALUES ('cy', :d, 'nudge', 1, 1, 1, :at, :at)",
            d=delivery,
            at=NOW - timedelta(days=day),
        )
    with frozen_clock(NOW):
        assert remove_old()["inbox_items"] == 1
    assert [r[0] for r in _sql("SELECT delivery_id FROM inbox_items")] == [2]


def test_retention_runs_hourly_on_the_control_lane():
    entry = celeryconfig.beat_schedule["retention"]
    assert entry["task"] == "clarion.retention"
    assert entry["options"]["queue"] == "control"
    assert celeryconfig.task_routes["clarion.retention"] == {"queue": "control"}
