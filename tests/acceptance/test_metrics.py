"""/metrics under Celery's prefork pool: real workers (two pool processes each) write their counts
to the multiprocess folder and one scrape sums them. What the metrics say is checked against what
the webhook receiver counted, and the ledger's gauges against the ledger."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from adapters.base import Receipt
from clarion import clock, metrics, settings
from ops import launch
from ops.receiver import Receiver
from tasks import notify_many, register_recipient
from tasks.receipts import ingest
from tests.support.cluster import Cluster, wait_settled
from tests.support.pipeline import rows
from web.app import create_app

pytestmark = pytest.mark.acceptance

N = 40


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with TestClient(create_app()) as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    """The sum over every sample of `name` whose labels include `labels`."""
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
    )


def test_worker_pool_processes_counts_add_up_in_one_scrape(clarion_env, tmp_path):
    before = scrape()
    with Receiver(settings.get().webhook_secret) as hooks:
        env = {
            **clarion_env.env,
            "CLARION_WEBHOOK_URL": hooks.url,
            "CLARION_TICK_INTERVAL": "0.5",
            "CLARION_BATCH_SIZE": "5",  # many deliver tasks, spread over both pool processes
            "PROMETHEUS_MULTIPROC_DIR": metrics.folder(),
        }
        cluster = Cluster(env, tmp_path / "logs")
        cluster.worker("lanes", ["transactional", "activation"], concurrency=2)
        cluster.worker("control", ["control"], concurrency=1)
        cluster.beat()
        try:
            for n in range(N):
                register_recipient(f"u{n}", timezone="UTC")
            notify_many(
                {
                    "user_id": f"u{n}",
                    "type_key": "receipt",
                    "event_id": "o",
                    "variables": {"order": n},
                }
                for n in range(N)
            )
            assert wait_settled(60, expect_sent=N)
            assert launch.wait_until(lambda: hooks.arrivals.total >= N, 30, 0.2)
            ticked = launch.wait_until(
                lambda: (
                    value(scrape(), "clarion_tick_seconds_count")
                    > value(before, "clarion_tick_seconds_count")
                ),
                30,
                0.5,
            )
        finally:
            cluster.stop()
    after = scrape()
    sent = value(after, "clarion_sends_total", outcome="sent", channel="webhook") - value(
        before, "clarion_sends_total", outcome="sent", channel="webhook"
    )
    assert sent == hooks.arrivals.unique == N  # counted at the receiver
    timed = value(after, "clarion_event_to_sent_seconds_count", channel="webhook") - value(
        before, "clarion_event_to_sent_seconds_count", channel="webhook"
    )
    assert timed == N
    assert ticked
    pids = {line.split("_")[-1].removesuffix(".db") for line in _files()}
    assert len(pids) >= 3, pids  # pool children of both workers wrote their own files

    # the ledger's gauges: nothing open now, and the queues answer
    assert value(after, "clarion_open_deliveries") == 0
    assert ("clarion_queue_depth", (("queue", "transactional"),)) in after
    assert value(after, "clarion_oldest_due_seconds", kind="deliveries") == 0

    # a delivered receipt feeds event → delivered
    [row] = rows("SELECT provider_message_id FROM deliveries WHERE user_id = 'u0'")
    assert ingest(
        [
            Receipt(
                channel="webhook",
                event="delivered",
                provider_message_id=row["provider_message_id"],
                occurred_at=clock.now(),
            )
        ]
    ) == {"applied": 1}
    final = scrape()
    assert (
        value(final, "clarion_event_to_delivered_seconds_count", channel="webhook")
        - value(after, "clarion_event_to_delivered_seconds_count", channel="webhook")
        == 1
    )
    assert value(final, "clarion_receipts_total", event="delivered", outcome="applied") >= 1


def _files() -> list[str]:
    from pathlib import Path

    return [p.name for p in Path(metrics.folder()).glob("counter_*.db")]


def test_the_grafana_dashboard_only_charts_metrics_clarion_exports(clarion_env):
    import json
    import re
    from pathlib import Path

    import ops

    dashboard = json.loads((Path(ops.__file__).parent / "grafana" / "clarion.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(clarion_[a-z_]+)", e)}
    declared = {
        getattr(metrics, name)._name + suffix
        for name in ("SENDS", "SUPPRESSED", "INCIDENTS", "RECEIPTS", "EVENT_TO_SENT")
        + ("EVENT_TO_DELIVERED", "TICK_SECONDS", "TICK_TAKEN")
        for suffix in ("_total", "_bucket", "_count", "_sum")
    } | {family.name for family in metrics.LedgerCollector().collect()}
    assert used and used <= declared, used - declared


def test_digest_windows_and_waiting_escalations_are_gauges(clarion_env):
    from sqlalchemy import text

    from db.engine import engine
    from tasks import notify

    register_recipient("ann", timezone="UTC")
    request = notify("ann", "receipt", event_id="e1", variables={"order": "A-1"})
    digest = (
        "INSERT INTO digests (user_id, digest_type, digest_key, state, opened_at, due_at,"
        " max_items, count, items) VALUES ('ann', 'replies', :key, :state, now(), now(), 50,"
        " :count, '[]')"
    )
    with engine().begin() as conn:
        for key, state, count in (("a", "open", 3), ("b", "full", 50), ("c", "closed", 7)):
            conn.execute(text(digest), {"key": key, "state": state, "count": count})
        conn.execute(
            text(
                "INSERT INTO escalations (user_id, request_id, type_key, steps, next_step, due_at,"
                " created_at, updated_at) VALUES ('ann', :r, 'page', '[]', 2, now(), now(), now())"
            ),
            {"r": request.request_id},
        )
    samples = scrape()
    assert value(samples, "clarion_digest_windows", digest_type="replies", state="open") == 1
    assert value(samples, "clarion_digest_windows", digest_type="replies", state="full") == 1
    assert value(samples, "clarion_digest_windows", state="closed") == 0  # closed ones are not open
    assert value(samples, "clarion_digest_items", digest_type="replies") == 53
    assert value(samples, "clarion_escalations_waiting", type="page", step="2") == 1
