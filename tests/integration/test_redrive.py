"""`clarion redrive` against real PostgreSQL and the real webhook receiver: a delivery that failed in
a rolling deploy (its pinned template version was missing on an older worker) is re-queued as the
same row and sent once, under the same idempotency key; filters, the dry run, the trail, and rows
that changed meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from clarion import settings
from clarion.db import ledger
from clarion.db import redrive as store
from clarion.db.engine import engine
from clarion.errors import FaultInjected
from clarion.ops.redrive import Filters, parse_time, redrive
from clarion.records import idempotency_key
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.environment import CATALOG
from tests.support.pipeline import configure, counts, drain, expire_lease, rows

pytestmark = pytest.mark.integration

Key = tuple[str, int]


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    with Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        register_recipient("ann", timezone="UTC")
        register_recipient("bo", timezone="UTC")
        yield running


def _old_worker_catalog(tmp_path: Path) -> Path:
    """The test catalog as a worker one release behind has it: receipt v1 only, no nudge type."""
    data = yaml.safe_load(CATALOG.read_text())
    del data["types"]["nudge"]
    data["types"]["receipt"]["templates"] = [
        t for t in data["types"]["receipt"]["templates"] if t["version"] == 1
    ]
    path = tmp_path / "old-catalog.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _failed_in_a_rolling_deploy(
    monkeypatch,
    tmp_path: Path,
    user: str = "ann",
    type_key: str = "receipt",
    variables: dict | None = None,
) -> Key:
    """A request pinned by a newer producer, delivered by an older worker past the skew grace:
    fails template_missing.

    The worker that routes a request sends it (in the same process), so a type the older worker
    has is routed and sent by it. One it lacks altogether it would route as `unknown_type`, with
    no delivery: that request is routed by a newer worker that stops right after its commit
    (before its send), and the older worker's deliver task takes the row over once the claim's
    lease has run out."""
    request = notify(
        user, type_key, event_id=f"e-{user}-{type_key}", variables=variables or {"order": "A-1"}
    )
    old = _old_worker_catalog(tmp_path)
    known_to_old = type_key in yaml.safe_load(old.read_text())["types"]
    if known_to_old:
        configure(monkeypatch, catalog=old, catalog_skew_grace=0.001)
        assert route([user], [request.request_id]) == 1
    else:
        configure(monkeypatch, faults="route.after_commit=raise*1")
        with pytest.raises(FaultInjected):
            route([user], [request.request_id])
    [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request.request_id)
    key = (row["user_id"], row["id"])
    if not known_to_old:
        expire_lease(key)
        configure(monkeypatch, faults=None, catalog=old, catalog_skew_grace=0.001)
        assert deliver([key[0]], [key[1]]) == 0
    configure(
        monkeypatch, catalog=CATALOG, catalog_skew_grace=None
    )  # the deploy finished: all have v2
    drain("transactional")
    drain("activation")
    return key


def _delivery(key: Key) -> dict:
    [row] = rows("SELECT * FROM deliveries WHERE user_id = :u AND id = :i", u=key[0], i=key[1])
    return row


def test_a_failed_delivery_is_requeued_as_the_same_row_and_sent_once_under_its_key(
    receiver, monkeypatch, tmp_path
):
    key = _failed_in_a_rolling_deploy(monkeypatch, tmp_path)
    failed = _delivery(key)
    assert (failed["state"], failed["attempts"]) == ("failed", 1)
    assert failed["last_error"].startswith("template_missing")
    now = datetime.now(UTC)
    report = redrive(Filters(reason="template_missing"), dry_run=False, now=now)
    assert report.startswith("1 deliveries re-queued")
    again = _delivery(key)
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
    assert _delivery(key)["state"] == "sent"
    expected = idempotency_key("ann", "receipt", failed["occurrence_key"], "webhook")
    assert dict(receiver.arrivals.by_key) == {expected: 1}
    assert redrive(Filters(), dry_run=False).startswith(
        "0 deliveries"
    )  # a sent row is never redriven


def test_the_dry_run_lists_counts_and_rows_and_changes_nothing(receiver, monkeypatch, tmp_path):
    keys = [_failed_in_a_rolling_deploy(monkeypatch, tmp_path, user) for user in ("ann", "bo")]
    before = (counts(), [_delivery(k) for k in keys])
    report = redrive(Filters(), dry_run=True)
    assert (counts(), [_delivery(k) for k in keys]) == before
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
    ann = _failed_in_a_rolling_deploy(monkeypatch, tmp_path, "ann")
    bo = _failed_in_a_rolling_deploy(monkeypatch, tmp_path, "bo")
    stopped = _delivery(bo)["updated_at"]

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
    key = _failed_in_a_rolling_deploy(monkeypatch, tmp_path)
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
    failed = _failed_in_a_rolling_deploy(
        monkeypatch, tmp_path, type_key="nudge", variables={"name": "Ann"}
    )
    row = _delivery(failed)
    assert row["state"] == "failed" and row["one_platform"]
    with engine().begin() as conn:  # the same one_platform occurrence, sent on another channel
        [(user, other, *_)] = ledger.insert_deliveries(
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
    assert deliver([user], [other]) == 1
    assert redrive(Filters(), dry_run=True).startswith("0 deliveries")
    with engine().begin() as conn:
        assert store.requeue(conn, [failed], states=("failed",), now=datetime.now(UTC)) == set()
    assert _delivery(failed)["state"] == "failed"


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
