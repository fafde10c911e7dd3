"""`clarion redrive` against real PostgreSQL and the real webhook receiver: a delivery that failed in
a rolling deploy (its pinned template version was missing on an older worker) is re-queued as the
same row and sent once, under the same idempotency key; filters, the dry run, the trail, and rows
that changed meanwhile."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clarion.db import ledger
from clarion.db import redrive as store
from clarion.db.engine import engine
from clarion.ops.redrive import Filters, parse_time, redrive
from clarion.records import idempotency_key
from clarion.tasks.deliver import deliver
from tests.support.pipeline import counts, rows
from tests.support.redrive import Key, delivery, failed_in_a_rolling_deploy, receiver

pytestmark = pytest.mark.integration
__all__ = ["receiver"]  # a fixture, from tests/support/redrive.py


def test_a_failed_delivery_is_requeued_as_the_same_row_and_sent_once_under_its_key(
    receiver, monkeypatch, tmp_path
):
    key = failed_in_a_rolling_deploy(monkeypatch, tmp_path)
    failed = delivery(key)
    assert (failed["state"], failed["attempts"]) == ("failed", 1)
    assert failed["last_error"].startswith("template_missing")
    now = datetime.now(UTC)
    report = redrive(Filters(reason="template_missing"), dry_run=False, now=now)
    assert report.startswith("1 deliveries re-queued")
    again = delivery(key)
    assert (again["state"], again["attempts"], again["last_error"]) == ("pending", 0, None)
    assert again["due_at"] == again["not_before"] == now  # the tick republishes it now
    assert {k: again[k] for k in ("request_id", "type_key", "occurrence_key", "channel")} == {
        k: failed[k] for k in ("request_id", "type_key", "occurrence_key", "channel")
    }
    [trail] = rows(
        "SELECT gate, outcome, reason, detail, delivery_id FROM decisions WHERE gate = 'redrive'"
    )
    assert (trail["outcome"], trail["reason"], trail["delivery_id"]) == (
        "requeue",
        "redrive",
        key[1],
    )
    assert trail["detail"].startswith(
        "redriven from failed (template_missing) after 1 attempt(s): template_missing"
    )
    assert rows("SELECT reason FROM decisions WHERE gate = 'deliver'") == [
        {"reason": "template_missing"}
    ]

    assert deliver([key[0]], [key[1]]) == 1
    assert delivery(key)["state"] == "sent"
    expected = idempotency_key("ann", "receipt", failed["occurrence_key"], "webhook")
    assert dict(receiver.arrivals.by_key) == {expected: 1}
    assert redrive(Filters(), dry_run=False).startswith(
        "0 deliveries"
    )  # a sent row is never redriven


def test_the_dry_run_lists_counts_and_rows_and_changes_nothing(receiver, monkeypatch, tmp_path):
    keys = [failed_in_a_rolling_deploy(monkeypatch, tmp_path, user) for user in ("ann", "bo")]
    before = (counts(), [delivery(k) for k in keys])
    report = redrive(Filters(), dry_run=True)
    assert (counts(), [delivery(k) for k in keys]) == before
    lines = report.splitlines()
    assert lines[0] == "2 deliveries would be re-queued (dry run: nothing changed)"
    assert any(line.split() == ["receipt", "template_missing", "failed", "2"] for line in lines), (
        report
    )
    listed = [line.split() for line in lines if line.startswith(("ann ", "bo "))]
    assert [(r[0], int(r[1]), r[2], r[3], r[4], r[5], r[6]) for r in listed] == [
        (k[0], k[1], "receipt", "webhook", "failed", "template_missing", "1") for k in keys
    ]


def test_filters_by_type_reason_state_time_and_limit(receiver, monkeypatch, tmp_path):
    ann = failed_in_a_rolling_deploy(monkeypatch, tmp_path, "ann")
    bo = failed_in_a_rolling_deploy(monkeypatch, tmp_path, "bo")
    stopped = delivery(bo)["updated_at"]

    def found(**filters) -> list[Key]:
        with engine().connect() as conn:
            return [
                (r.user_id, r.id)
                for r in store.find_redrivable(conn, **{"states": ("failed",), **filters})
            ]

    assert found() == [ann, bo]
    assert found(type_key="receipt") == [ann, bo] and found(type_key="nudge") == []
    assert found(reason="template_missing") == [ann, bo] and found(reason="retries_exhausted") == []
    assert found(states=("unknown",)) == []
    assert found(since=stopped) == [bo] and found(until=stopped) == [ann]
    assert found(since=stopped + timedelta(seconds=1)) == []
    assert found(limit=1) == [ann]


def test_a_row_that_changed_meanwhile_is_left_alone(receiver, monkeypatch, tmp_path):
    key = failed_in_a_rolling_deploy(monkeypatch, tmp_path)
    with engine().begin() as conn:
        assert store.requeue(conn, [key], states=("failed",), now=datetime.now(UTC)) == {key}
    with (
        engine().begin() as conn
    ):  # it is pending now: a second redrive of the same key does nothing
        assert store.requeue(conn, [key], states=("failed",), now=datetime.now(UTC)) == set()
        assert store.requeue(conn, [], states=("failed",), now=datetime.now(UTC)) == set()


def test_a_delivery_whose_occurrence_was_sent_by_another_is_not_redriven(
    receiver, monkeypatch, tmp_path
):
    failed = failed_in_a_rolling_deploy(
        monkeypatch, tmp_path, type_key="nudge", variables={"name": "Ann"}
    )
    row = delivery(failed)
    assert row["state"] == "failed" and row["one_platform"]
    with engine().begin() as conn:  # the same one_platform occurrence, sent on another channel
        [created] = ledger.insert_deliveries(
            conn,
            [
                ledger.NewDelivery(
                    "ann",
                    row["request_id"],
                    "nudge",
                    row["occurrence_key"],
                    "console",
                    True,
                    "activation",
                )
            ],
            now=datetime.now(UTC),
            due_at=datetime.now(UTC),
        )
    assert deliver([created.user_id], [created.id]) == 1
    assert redrive(Filters(), dry_run=True).startswith("0 deliveries")
    with engine().begin() as conn:
        assert store.requeue(conn, [failed], states=("failed",), now=datetime.now(UTC)) == set()
    assert delivery(failed)["state"] == "failed"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2d", timedelta(days=2)),
        ("6h", timedelta(hours=6)),
        ("30m", timedelta(minutes=30)),
    ],
)
def test_times_are_read_relative_to_now(value, expected):
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    assert parse_time(value, "--since", now) == now - expected
    assert parse_time("2026-12-01T00:00+00:00", "--until", now) == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_time(None, "--since", now) is None
