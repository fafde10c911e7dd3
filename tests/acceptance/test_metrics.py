"""/metrics under the documented commands, and under Celery's prefork pool.

The first test runs what the docs say to run (docs/operations/monitoring.md, "Metrics") —
`clarion worker`, a plain `celery -A clarion worker`, `clarion beat` and `clarion web` — with the
documented environment and nothing else (no
PROMETHEUS_MULTIPROC_DIR: the `celery` command imports prometheus_client before clarion, which once
left every worker counting in private memory), sends N notifications counted at a receiver, and
finds them and the ticks in one scrape of `clarion web`; then it freezes and stops its own
PostgreSQL and the same scrape still answers 200, with `clarion_database_up 0`.

The second: two lane workers (two pool processes each) send, each pool process writes its own
counts to the multiprocess folder, and every scrape sums them — including scrapes taken while the
sends are in flight. The counters are checked against the ledger (GROUP BY over deliveries,
decisions and incidents) and against what the receiving fake servers counted; the ledger's gauges
against the ledger."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pgserver
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from starlette.testclient import TestClient

from clarion import clock, metrics, settings
from clarion.db import gating
from clarion.db.engine import engine, migrate, one_off_engine
from clarion.db.schema import SENT_STATES
from clarion.ops import launch
from clarion.records import Receipt
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many, register_recipient
from clarion.tasks.preferences import set_preferences
from clarion.tasks.receipts import ingest
from clarion.web import scrape as scraping
from clarion.web.app import create_app
from tests.support.cluster import Cluster, counts
from tests.support.environment import TestEnv as Env
from tests.support.environment import reset_process_state
from tests.support.pipeline import configure, rows

pytestmark = pytest.mark.acceptance

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

N = 24  # receipts (transactional) and nudges (activation) each, to the receiver that takes them
LOST = 4  # answers the receiver loses after taking the message: unknown, resent, a `repeat`
REFUSED = 3  # receipts to a receiver that refuses the signature: 401, failed at once
STALLED = 3  # nudges to a receiver that answers 503 to everything: unknown until retries run out
OPTED_OUT = 3  # recipients who turned nudges off
LISTED = 3  # recipients whose webhook address is on the suppression list

# A type per lane that sends, and one per failing receiver (a per-type webhook url).
CATALOG = """
types:
  receipt:
    category: transactional
    channels: [webhook]
    templates: [{{version: 1, body: "Thanks for your order."}}]
  nudge:
    category: activation
    channels: [webhook]
    options: {{window_exempt: true}}
    templates: [{{version: 1, body: "Your plan is waiting."}}]
  refused:
    category: transactional
    channels: [webhook]
    config: {{webhook: {{url: "{refused}"}}}}
    templates: [{{version: 1, body: "Never taken."}}]
  stalled:
    category: activation
    channels: [webhook]
    options: {{window_exempt: true}}
    config: {{webhook: {{url: "{stalled}"}}}}
    templates: [{{version: 1, body: "Never answered."}}]
"""


def scrape() -> Samples:
    with TestClient(create_app()) as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return parse(answer.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of `name` whose labels include `labels`."""
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
    )


def parse(body: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


SENDING = """
types:
  receipt:
    category: transactional
    channels: [webhook]
    templates: [{version: 1, body: "Thanks for your order."}]
  nudge:
    category: activation
    channels: [webhook]
    options: {window_exempt: true}
    templates: [{version: 1, body: "Your plan is waiting."}]
"""
EACH = 15  # notifications per lane: one lane on `clarion worker`, the other on plain `celery`


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_postgres(
    clarion_env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[dict[str, str], object]]:
    """A PostgreSQL of this test's own (to freeze and stop) and the documented environment only:
    no PROMETHEUS_MULTIPROC_DIR (the test harness sets one for in-process tests; not here)."""
    postgres = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    with one_off_engine(postgres.get_uri()).connect() as conn:
        conn.execute(text("CREATE DATABASE metrics"))
    url = postgres.get_uri("metrics")
    env = {**clarion_env.env, "CLARION_DATABASE_URL": url}
    monkeypatch.setenv("CLARION_DATABASE_URL", url)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    reset_process_state()
    migrate(url)
    try:
        yield env, postgres
    finally:
        reset_process_state()
        with contextlib.suppress(Exception):  # already stopped by the test
            pgserver.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", "immediate", "stop"],
                pgdata=postgres.pgdata,
                user=postgres.system_user,
                timeout=60,
            )


def scrape_web(port: int) -> tuple[int, Samples, float]:
    """One GET of `clarion web`'s /metrics: status, samples, seconds it took."""
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        body = answer.read().decode()
        return answer.status, parse(body), time.monotonic() - started


def test_documented_commands_count_in_one_scrape_that_answers_without_the_database(
    own_postgres, tmp_path, monkeypatch
):
    env, postgres = own_postgres
    bin_dir = Path(sys.executable).parent
    clarion, celery, port = str(bin_dir / "clarion"), str(bin_dir / "celery"), _free_port()
    catalog = tmp_path / "sending.yaml"
    catalog.write_text(SENDING)
    logs = tmp_path / "logs"
    logs.mkdir()
    with Receiver(env["CLARION_WEBHOOK_SECRET"]) as hooks:
        env = {**env, "CLARION_CATALOG": str(catalog), "CLARION_WEBHOOK_URL": hooks.url}
        for key in ("CLARION_CATALOG", "CLARION_WEBHOOK_URL"):  # this process notifies too
            monkeypatch.setenv(key, env[key])
        reset_process_state()
        commands = {
            "transactional": [clarion, "worker", "--lane", "transactional", "-c", "2"],
            "activation": [celery, "-A", "clarion", "worker", "-Q", "activation", "-c", "2"]
            + ["-n", "activation@%h", "--loglevel", "INFO"],
            "control": [clarion, "worker", "--lane", "control", "-c", "1"],
            "beat": [clarion, "beat"],
            "web": [clarion, "web", "--port", str(port)],
        }
        processes = {
            name: launch.Process(command, env=env, log=logs / f"{name}.log", cwd=tmp_path)
            for name, command in commands.items()
        }
        try:
            for n in range(EACH):
                register_recipient(f"r{n}", timezone="UTC")
            notify_many(
                {"user_id": f"r{n}", "type_key": kind, "event_id": "o"}
                for n in range(EACH)
                for kind in ("receipt", "nudge")
            )
            deadline = time.monotonic() + 90
            while True:
                with contextlib.suppress(OSError):
                    status, seen, _ = scrape_web(port)
                    if value(seen, "clarion_sends_total", outcome="sent") >= 2 * EACH and value(
                        seen, "clarion_tick_seconds_count"
                    ):
                        break
                dead = [name for name, p in processes.items() if not p.alive()]
                assert not dead, f"{dead} exited: see {logs}"
                assert time.monotonic() < deadline, f"not counted after 90 s: see {logs}"
                time.sleep(0.5)

            # One scrape: each lane's sends (one lane per command), the ticks, the database.
            assert status == 200
            assert hooks.arrivals.unique == 2 * EACH
            for lane in ("transactional", "activation"):
                assert value(seen, "clarion_sends_total", lane=lane, outcome="sent") == EACH
            assert value(seen, "clarion_event_to_sent_seconds_count") == 2 * EACH
            assert value(seen, "clarion_tick_seconds_count") > 0
            assert value(seen, "clarion_database_up") == 1
            assert ("clarion_open_deliveries", ()) not in seen  # a family, with labels, if any

            # A database that hangs (postmaster stopped, not dead): the scrape is bounded.
            postmaster = int((Path(postgres.pgdata) / "postmaster.pid").read_text().split()[0])
            os.kill(postmaster, signal.SIGSTOP)
            try:
                status, frozen, took = scrape_web(port)
            finally:
                os.kill(postmaster, signal.SIGCONT)
            assert status == 200 and took < 5, (status, took)
            assert value(frozen, "clarion_database_up") == 0
            assert value(frozen, "clarion_sends_total", outcome="sent") == 2 * EACH

            # A database that is down: 200, the counters, clarion_database_up 0, no ledger gauges.
            pgserver.pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=postgres.pgdata,
                user=postgres.system_user,
                timeout=60,
            )
            status, down, took = scrape_web(port)
            assert status == 200 and took < 5, (status, took)
            assert value(down, "clarion_database_up") == 0
            assert value(down, "clarion_sends_total", outcome="sent") == 2 * EACH
            assert value(down, "clarion_tick_seconds_count") > 0
            assert not any(name == "clarion_open_deliveries" for name, _ in down)
        finally:
            for process in processes.values():
                process.stop()


def grown(after: Samples, before: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """What each label combination (`keys`) of counter `name` gained between two scrapes."""
    gains: Counter[tuple[str, ...]] = Counter()
    for (n, ls), v in after.items():
        if n == name:
            gains[tuple(dict(ls)[k] for k in keys)] += v - before.get((n, ls), 0.0)  # type: ignore[assignment]
    return {k: v for k, v in gains.items() if v}


def ledger(sql: str, **params: object) -> dict[tuple[str, ...], float]:
    """A GROUP BY over the ledger: every column but the last is the key, the last the count
    (columns need distinct names)."""
    counted = [tuple(r.values()) for r in rows(sql, **params)]
    return {r[:-1]: float(r[-1]) for r in counted if r[-1]}


def sent_by_process() -> Counter[int]:
    """clarion_sends_total{outcome="sent"} of each process's own counter file, by pid."""
    sent: Counter[int] = Counter()
    for path in Path(metrics.folder()).glob("counter_*.db"):
        pid = int(path.stem.removeprefix("counter_"))
        for family in MultiProcessCollector.merge([str(path)]):
            for s in family.samples:
                if s.name == "clarion_sends_total" and s.labels["outcome"] == "sent":
                    sent[pid] += s.value
    return sent


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (a Celery worker's pool), read from /proc."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == pid:
            found.add(int(stat.parent.name))
    return found


def settled(expected: int) -> bool:
    """Every request routed, all `expected` deliveries made, and none waiting to be sent."""
    return (
        counts("SELECT count(*) FROM requests WHERE state <> 'routed'") == 0
        and counts("SELECT count(*) FROM deliveries") == expected
        and counts("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'claimed')") == 0
    )


def test_counters_of_four_pool_processes_add_up_to_the_ledger_while_they_send(
    clarion_env, tmp_path, monkeypatch
):
    secret = settings.get().webhook_secret
    with (
        Receiver(secret, latency=0.25) as hooks,  # slow enough that scrapes land mid-run
        Receiver("not clarion's secret") as refusing,
        Receiver(secret) as down,
    ):
        hooks.arrivals.losses.next("5xx", times=LOST)
        down.arrivals.fail_next = STALLED_ANSWERS = 10**6
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(CATALOG.format(refused=refusing.url, stalled=down.url))
        configure(monkeypatch, catalog=catalog)
        items = _recipients()
        before, sent_before = scrape(), sent_by_process()
        cluster = Cluster(
            {
                **clarion_env.env,
                "CLARION_CATALOG": str(catalog),
                "CLARION_WEBHOOK_URL": hooks.url,
                "CLARION_TICK_INTERVAL": "0.5",
                "CLARION_BATCH_SIZE": "5",  # many deliver tasks, spread over the pool processes
                "CLARION_SEND_CONCURRENCY": "1",  # a batch makes its sends one after another
                "CLARION_MAX_ATTEMPTS": "2",  # a lost answer is resent once; a stalled row fails
            },
            tmp_path / "logs",
        )
        lanes = ("lanes-a", "lanes-b")
        for name in lanes:
            cluster.worker(name, ["transactional", "activation"], concurrency=2)
        cluster.worker("control", ["control"], concurrency=1)
        cluster.beat()
        try:
            cluster.wait_ready(lanes, 60)
            pools = {pid for name in lanes for pid in children(cluster.processes[name].pid)}
            assert len(pools) == 4, pools
            notify_many(
                {"user_id": user, "type_key": type_key, "event_id": "o"} for type_key, user in items
            )
            during = [scrape()]
            deadline = time.monotonic() + 60
            while not (settled(2 * N + REFUSED + STALLED) and hooks.arrivals.total >= 2 * N + LOST):
                assert time.monotonic() < deadline, f"not settled after 60 s: see {cluster.logs}"
                time.sleep(0.2)
                during.append(scrape())
        finally:
            cluster.stop()
    after = scrape()

    # Counters only grow, scrape after scrape, and a scrape taken mid-run saw part of the sends.
    scrapes = [before, *during, after]
    for earlier, later in zip(scrapes, scrapes[1:], strict=False):
        shrunk = {
            key: (was, later.get(key, 0.0))
            for key, was in earlier.items()
            if key[0].endswith(("_total", "_count")) and later.get(key, 0.0) < was
        }
        assert not shrunk, shrunk
    start = value(before, "clarion_sends_total", outcome="sent")
    sent = value(after, "clarion_sends_total", outcome="sent") - start
    midway = [value(s, "clarion_sends_total", outcome="sent") - start for s in during]
    assert any(0 < n < sent for n in midway), midway

    # Each of the four pool processes sent, and the scrape is the sum of their files.
    by_process = sent_by_process() - sent_before
    assert all(by_process[pid] > 0 for pid in pools), (pools, by_process)
    assert sum(by_process.values()) == sent

    # What the receiving servers counted.
    assert sent == hooks.arrivals.unique == 2 * N
    assert hooks.arrivals.repeats == LOST  # each lost answer resent once, and answered 409
    assert refusing.arrivals.rejected == REFUSED
    stalled_answers = STALLED_ANSWERS - down.arrivals.fail_next
    assert stalled_answers == 2 * STALLED  # both attempts of each
    assert grown(after, before, "clarion_sends_total", "outcome") == {
        ("sent",): 2 * N,
        ("failed",): REFUSED + STALLED,
        ("unknown",): LOST + stalled_answers,
    }

    # The same counters against the ledger, label by label.
    assert grown(after, before, "clarion_sends_total", "lane", "channel", "outcome") == (
        ledger_sends()
    )
    assert ledger("SELECT reason, count(*) FROM decisions WHERE gate = 'deliver' GROUP BY 1") == {
        ("http_401",): REFUSED,
        ("retries_exhausted",): STALLED,
    }
    suppressed = ledger(
        "SELECT gate, reason, count(*) FROM decisions"
        " WHERE gate <> 'deliver' AND outcome <> 'allow' GROUP BY 1, 2"
    )
    assert suppressed == {
        ("preferences", "opted_out"): OPTED_OUT,
        ("suppression", "suppressed_address"): LISTED,
        ("channels", "no_channel"): OPTED_OUT + LISTED,
    }
    assert grown(after, before, "clarion_suppressed_total", "gate", "reason") == suppressed
    incidents = ledger("SELECT kind, count(*) FROM incidents GROUP BY 1")
    assert incidents == {("repeat",): LOST}
    assert grown(after, before, "clarion_incidents_total", "kind") == incidents

    # Latency for every send; the beat ticked; the ledger's gauges: nothing open, queues answer.
    assert grown(after, before, "clarion_event_to_sent_seconds_count", "channel") == {
        ("webhook",): sent
    }
    assert grown(after, before, "clarion_tick_seconds_count")
    assert value(after, "clarion_open_deliveries") == 0
    assert ("clarion_queue_depth", (("queue", "transactional"),)) in after
    assert value(after, "clarion_oldest_due_seconds", kind="deliveries") == 0

    # A delivered receipt feeds event → delivered.
    [row] = rows("SELECT provider_message_id FROM deliveries WHERE user_id = 'r0'")
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
    assert grown(final, after, "clarion_event_to_delivered_seconds_count", "channel") == {
        ("webhook",): 1
    }
    assert value(final, "clarion_receipts_total", event="delivered", outcome="applied") >= 1


def _recipients() -> list[tuple[str, str]]:
    """Register the run's recipients (opted out, or on the suppression list, as their initial
    says) and return the (type, user) of each request to make."""
    items = [("receipt", f"r{n}") for n in range(N)] + [("nudge", f"n{n}") for n in range(N)]
    items += [("refused", f"f{n}") for n in range(REFUSED)]
    items += [("stalled", f"s{n}") for n in range(STALLED)]
    items += [("nudge", f"o{n}") for n in range(OPTED_OUT)]
    items += [("receipt", f"l{n}") for n in range(LISTED)]
    for _, user in items:
        register_recipient(user, timezone="UTC")
    for n in range(OPTED_OUT):
        set_preferences(f"o{n}", {"type:nudge": False})
    with engine().begin() as conn:
        for n in range(LISTED):
            gating.suppress_address(
                conn,
                f"l{n}",
                channel="webhook",
                address=f"l{n}",  # a webhook address is the user id
                reason="complaint",
                detail="listed by the test",
                now=clock.now(),
            )
    return items


def ledger_sends() -> dict[tuple[str, ...], float]:
    """clarion_sends_total as the ledger tells it, by lane, channel and outcome. A row's attempts
    before its last had unknown outcomes (this run has no refusal worth a retry), and so had the
    last of a row whose retries ran out."""
    sends = ledger(
        "SELECT lane, channel, CASE WHEN state = 'failed' THEN 'failed' ELSE 'sent' END AS outcome,"
        " count(*)"
        " FROM deliveries WHERE state = 'failed' OR state = ANY(:sent) GROUP BY 1, 2, 3",
        sent=list(SENT_STATES),
    )
    unknown = ledger(
        "SELECT d.lane, d.channel, 'unknown' AS outcome, sum(d.attempts - 1) + count(x.reason) AS n"
        " FROM deliveries d LEFT JOIN decisions x ON x.user_id = d.user_id"
        "  AND x.delivery_id = d.id AND x.reason = 'retries_exhausted'"
        " GROUP BY 1, 2"
    )
    return {**sends, **unknown}


def test_the_grafana_dashboard_only_charts_metrics_clarion_exports(clarion_env):
    import json
    import re
    from pathlib import Path

    from clarion import ops

    dashboard = json.loads((Path(ops.__file__).parent / "grafana" / "clarion.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(clarion_[a-z_]+)", e)}
    declared = {
        getattr(metrics, name)._name + suffix
        for name in ("SENDS", "SUPPRESSED", "INCIDENTS", "RECEIPTS", "EVENT_TO_SENT")
        + ("EVENT_TO_DELIVERED", "TICK_SECONDS", "TICK_TAKEN")
        for suffix in ("_total", "_bucket", "_count", "_sum")
    } | {family.name for family in scraping.LedgerCollector().collect()}
    assert used and used <= declared, used - declared


def test_digest_windows_and_waiting_escalations_are_gauges(clarion_env):

    from clarion.db.engine import engine
    from clarion.tasks import notify

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
