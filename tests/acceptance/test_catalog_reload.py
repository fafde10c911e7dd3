"""A catalog edit reaches running workers with no restart, deliveries in flight (issue 23 item 5).

Two real worker processes and beat send receipts pinned to v1 to a slow webhook receiver; while
they are in flight the file is replaced with one that adds receipt v2 and a new type. Receipts
pinned to v2 and the new type are then notified. Counted at the receiver: everything arrives once,
each body is the text of the version its request was pinned to, and nothing was deferred as a
type or version missing here (no `template_missing`, no wait near the skew grace). Then a broken
edit: the workers keep the last good catalog, log the refusal, and still send. And an idle
worker (prefork and solo) takes an edit with no task at all (tasks/catalogs.py's watch)."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many, register_recipient, runtime
from tests.support.cluster import Cluster, children, counts, wait_settled
from tests.support.pipeline import configure

pytestmark = pytest.mark.acceptance

USERS = 30
GRACE = 30  # CLARION_CATALOG_SKEW_GRACE for the workers, seconds


def receipt(versions: int) -> dict[str, Any]:
    return {
        "category": "transactional",
        "channels": ["webhook"],
        "required": ["n"],
        "templates": [
            {"version": v, "body": f"v{v} receipt {{{{ n }}}}"} for v in range(1, versions + 1)
        ],
    }


V1 = {"types": {"receipt": receipt(1)}}
V2 = {
    "types": {
        "receipt": receipt(2),
        "welcome": {
            "category": "transactional",
            "channels": ["webhook"],
            "templates": [{"version": 1, "body": "v1 welcome"}],
        },
    }
}


BROKEN = copy.deepcopy(V2)  # a filter Jinja does not have: the load-time render fails
BROKEN["types"]["welcome"]["templates"][0]["body"] = "{{ 'x' | shout }}"


def replace(path: Path, content: str) -> None:
    """Edit as a deploy should: write a new file, rename it over the old one."""
    fresh = path.with_suffix(".new")
    fresh.write_text(content)
    os.replace(fresh, path)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def pinned() -> dict[int, tuple[str, int]]:
    """delivery id -> (type, the template version its request was pinned to)."""
    with engine().connect() as conn:
        found = conn.execute(
            text(
                "SELECT d.id, d.type_key, r.template_version FROM deliveries d "
                "JOIN requests r ON r.user_id = d.user_id AND r.id = d.request_id"
            )
        )
        return {row[0]: (row[1], row[2]) for row in found}


def logs_of(logs: Path, name: str) -> str:
    return "".join(p.read_text(errors="replace") for p in logs.glob(f"{name}.*.log"))


POOL = 3  # pool processes: w1's two and w2's one


def saying(log: Path, phrase: str) -> set[str]:
    """The processes (MainProcess, ForkPoolWorker-N) whose lines in one worker's log hold
    `phrase`: a line names its process."""
    return {
        line.split("/", 1)[1].split("]", 1)[0]
        for line in log.read_text(errors="replace").splitlines()
        if phrase in line and "/" in line
    }


def processes_saying(logs: Path, phrase: str) -> int:
    """Pool processes of every worker whose log lines hold `phrase`."""
    return len(
        {
            (log.name, process)
            for log in logs.glob("w*.log")
            for process in saying(log, phrase)
            if process.startswith("ForkPoolWorker")
        }
    )


def test_a_catalog_edit_reaches_running_workers_with_deliveries_in_flight(
    clarion_env, tmp_path, monkeypatch
) -> None:
    path = tmp_path / "catalog.yaml"
    replace(path, yaml.safe_dump(V1))
    configure(monkeypatch, catalog=path)
    logs = tmp_path / "logs"
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        receiver.arrivals.latency = 0.03  # keeps the first batch in flight during the edit
        env = {
            **clarion_env.env,
            "CLARION_CATALOG": str(path),
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_CATALOG_SKEW_GRACE": str(GRACE),
            "CLARION_TICK_INTERVAL": "0.5",
        }
        for u in range(USERS):
            register_recipient(f"u{u}", timezone="UTC")
        cluster = Cluster(env, logs)
        try:
            cluster.worker("w1", concurrency=2)
            cluster.worker("w2", concurrency=1)
            cluster.beat()
            cluster.wait_ready(["w1", "w2"], 60)
            notify_many(
                [
                    dict(user_id=f"u{u}", type_key="receipt", event_id="e1", variables={"n": u})
                    for u in range(USERS)
                ]
            )
            wait_for(lambda: receiver.arrivals.unique >= 3, 60, "the first receipts to arrive")
            in_flight = USERS - receiver.arrivals.unique
            replace(path, yaml.safe_dump(V2))
            # this process is a producer too: it sees the edit on its next look (at most 1 s) or
            # at once on a miss (the new type); receipts pin v2 from then on
            wait_for(lambda: runtime.catalog().types["receipt"].version == 2, 5, "v2 pinned here")
            notify_many(
                [
                    dict(user_id=f"u{u}", type_key=t, event_id="e2", variables={"n": u})
                    for u in range(USERS)
                    for t in ("receipt", "welcome")
                ]
            )
            settled = wait_settled(120, expect_sent=3 * USERS)
            # every pool process took the edit, those that had no task since included (each
            # looks at the file every second): none is left on v1 when the file breaks
            wait_for(
                lambda: processes_saying(logs, "catalog reloaded") == POOL,
                10,
                "every pool process to reload",
            )

            # a broken edit: the workers keep the last good catalog, say why, and go on sending
            replace(path, yaml.safe_dump(BROKEN))
            wait_for(
                lambda: processes_saying(logs, "catalog change refused") == POOL,
                10,
                "every pool process to refuse the broken edit",
            )
            notify_many(
                [dict(user_id=f"u{u}", type_key="welcome", event_id="e3") for u in range(4)]
            )
            settled_again = wait_settled(60, expect_sent=3 * USERS + 4)
        finally:
            cluster.stop()
        assert settled and settled_again, f"the pipeline did not settle: see {logs}"
        assert in_flight > 0, "the edit came after every first receipt had arrived"

        sent = pinned()
        assert len(sent) == 3 * USERS + 4
        assert receiver.arrivals.unique == 3 * USERS + 4 and receiver.arrivals.repeats == 0
        for key, delivery in receiver.arrivals.deliveries.items():
            type_key, version = sent[delivery]  # type: ignore[index]
            body = receiver.arrivals.contents[key]["body"]
            assert body.startswith(f"v{version} {type_key}"), (delivery, version, body)
        versions = [v for t, v in sent.values() if t == "receipt"]
        assert sorted(versions) == [1] * USERS + [2] * USERS

    assert counts("SELECT count(*) FROM deliveries WHERE state <> 'sent'") == 0
    assert counts("SELECT count(*) FROM deliveries WHERE last_error IS NOT NULL") == 0
    slowest = counts(
        "SELECT coalesce(max(extract(epoch FROM d.sent_at - r.created_at)), 0) "
        "FROM deliveries d JOIN requests r ON r.user_id = d.user_id AND r.id = d.request_id"
    )
    assert slowest < 10, f"a delivery waited {slowest} s (skew grace {GRACE} s, retry 10 s)"
    said = logs_of(logs, "w1") + logs_of(logs, "w2")
    assert "catalog reloaded" in said and "unknown filter 'shout'" in said, f"see {logs}"
    assert "types not in this catalog yet" not in said, f"a route deferred a type: see {logs}"


@pytest.mark.parametrize(
    ("pool", "processes"),
    [("prefork", {"ForkPoolWorker-1", "ForkPoolWorker-2"}), ("solo", {"MainProcess"})],
)
def test_an_idle_worker_takes_an_edit_and_keeps_it_through_a_broken_one(
    clarion_env, tmp_path, pool, processes
) -> None:
    """No task is sent: each process (a pool process, or a solo worker's main process) looks at
    the file on its own; a pool process started after the broken edit runs the catalog its worker
    checked. The only evidence is each process's own log line."""
    path = tmp_path / "catalog.yaml"
    replace(path, yaml.safe_dump(V1))
    logs = tmp_path / "logs"
    cluster = Cluster({**clarion_env.env, "CLARION_CATALOG": str(path)}, logs)
    try:
        cluster.worker("w", ["control"], concurrency=2, pool=pool)
        cluster.wait_ready(["w"], 60)
        [log] = logs.glob("w.*.log")
        replace(path, yaml.safe_dump(V2))
        wait_for(lambda: saying(log, "catalog reloaded") == processes, 15, "every process reloads")
        replace(path, yaml.safe_dump(BROKEN))
        wait_for(
            lambda: saying(log, "catalog change refused") == processes,
            15,
            "every process refuses the broken edit",
        )
        if pool == "prefork":  # a pool process started now inherits the good catalog
            for pid in children(cluster.processes["w"].pid):
                os.kill(pid, 9)
            wait_for(
                lambda: len(saying(log, "catalog change refused") - processes) == 2,
                30,
                "the replaced pool processes to refuse the file (not fail to load it)",
            )
    finally:
        cluster.stop()
    said = log.read_text(errors="replace")
    assert said.count("sha256") >= 1 and "Traceback" not in said, f"see {log}"
    assert "the catalog does not load" not in said, f"see {log}"
