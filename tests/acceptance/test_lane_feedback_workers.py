"""The bulk lanes' feedback (tasks/lanes.py) with real worker processes: a transactional pool
process SIGKILLed in the middle of a route task (a crash right after its provider accepted the
message, as `clarion demo` does) leaves its in-flight mark behind, and the nudges that follow are
not held up by it past the mark's short lease.

Before the fix the mark counted for 60 s: every bulk slice waited out its full patience (0.5 s)
for a receipt that would never finish, and each halved the rate, down to the rule's floor of one
row a slice, so the activation lane crawled at about two rows a second per pool process and
`clarion demo`'s digest was not routed within the demo's wait."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, notify_many, register_recipient
from tests.support.cluster import Cluster, counts

pytestmark = pytest.mark.acceptance

NUDGES, BATCH = 400, 10
WITHIN = 20.0  # seconds: flat out they take 1-2 s here; behind the dead mark, over 55 s
NUDGES_SENT = "SELECT count(*) FROM deliveries WHERE type_key = 'nudge' AND state = 'sent'"


def test_a_dead_transactional_process_does_not_hold_the_bulk_lanes_back(clarion_env, tmp_path):
    faults = tmp_path / "faults"
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        env = {
            **clarion_env.env,
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_BULK_FEEDBACK": "on",
            "CLARION_FAULTS_DIR": str(faults),
        }
        cluster = Cluster(env, tmp_path / "logs")
        try:
            # only the transactional worker crashes: after the send, inside its route task
            cluster.worker(
                "fb-t",
                ["transactional", "control"],
                concurrency=2,
                env={"CLARION_FAULTS": "deliver.after_send=crash*1"},
            )
            cluster.worker("fb-a", ["activation"], concurrency=2)
            cluster.beat()
            cluster.wait_ready(["fb-t", "fb-a"], 60)
            register_recipient("ann", timezone="UTC")
            notify("ann", "receipt", event_id="r0", variables={"order": 0})
            deadline = time.monotonic() + 30
            while not (faults / "deliver.after_send.1").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (faults / "deliver.after_send.1").exists(), "the transactional crash never came"
            began = time.monotonic()
            for start in range(0, NUDGES, BATCH):  # one route task each: each slows the pacer
                notify_many(
                    [
                        dict(
                            user_id="ann",
                            type_key="nudge",
                            event_id=f"n{i}",
                            variables={"name": "A"},
                        )
                        for i in range(start, start + BATCH)
                    ]
                )
            # the mark's lease, then the nudges flat out (about a second unloaded); while a dead
            # mark counted for a minute, each batch halved its pool process's rate down to one row
            # a slice, each slice waiting 0.5 s: they were sent only once the minute was over
            sent = 0
            while sent < NUDGES and time.monotonic() - began < WITHIN:
                time.sleep(0.25)
                sent = counts(NUDGES_SENT)
            took = time.monotonic() - began
        finally:
            cluster.stop_together()
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("fb-t.*.log"))
    assert "signal 9 (SIGKILL)" in logs  # the transactional pool process died mid-task
    assert sent == NUDGES, (
        f"{sent}/{NUDGES} nudges sent after {took:.1f} s: the bulk lane waited on a dead mark"
    )


def _niced_backends() -> list[tuple[int, int | None]]:
    """Each of this database's backends that runs niced (the server is on this host): its
    niceness, and its scheduling group's (None without autogroup)."""
    with engine().connect() as conn:
        pids = conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ).scalars()
        found = []
        for pid in pids:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # one that left
                group = Path(f"/proc/{pid}/autogroup")
                found.append(
                    (
                        os.getpriority(os.PRIO_PROCESS, pid),
                        int(group.read_text().split()[-1]) if group.exists() else None,
                    )
                )
    return [(n, g) for n, g in found if n > 0 or (g or 0) > 0]


@pytest.mark.parametrize("database", ["default", "off"])
def test_a_bulk_workers_database_backends_run_niced(clarion_env, tmp_path, database):
    """The bulk worker's niceness holds for its session (autogroup); CLARION_BULK_NICE_DATABASE=on
    (the default): its backends take its niceness, and their sessions', on a server on this host;
    off, none is niced (the test's own backends never are)."""
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        env = {
            **clarion_env.env,
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_BULK_NICE": "7",
            # the default (on) as a user gets it: the variable unset
            **({} if database == "default" else {"CLARION_BULK_NICE_DATABASE": database}),
        }
        cluster = Cluster(env, tmp_path / "logs")
        try:
            cluster.worker("nice-a", ["activation"], concurrency=1)
            cluster.wait_ready(["nice-a"], 60)
            register_recipient("ann", timezone="UTC")
            notify_many(
                [dict(user_id="ann", type_key="nudge", event_id="n", variables={"name": "A"})]
            )
            deadline = time.monotonic() + 30
            while counts(NUDGES_SENT) < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            niced = _niced_backends()  # the worker's pool keeps its connections open
            # started in a session of its own (as systemd or ops/launch.py start it), the worker
            # niced the session too: under autogroup its own niceness counts only within it
            session = Path(f"/proc/{cluster.processes['nice-a'].pid}/autogroup").read_text()
        finally:
            cluster.stop_together()
    assert counts(NUDGES_SENT) == 1
    assert session.split()[-2:] == ["nice", "7"], session
    if database == "default":
        # each backend leads a session of its own (PostgreSQL's setsid), so under autogroup its
        # group's niceness is what counts, and is raised too
        assert niced and all(n >= 7 and (g is None or g >= 7) for n, g in niced), niced
    else:
        assert niced == []
