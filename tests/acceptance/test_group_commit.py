"""Group commit of "sent" records under a real kill: a worker SIGKILLed with a whole group of
accepted sends not yet recorded. Counted at the receiving servers: each pending row ends as the
unknown-outcome policy says (tasks.send.outcomes.unknown_action), and nothing reaches a channel that
cannot dedup twice without an incident."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from clarion.adapters.teams import ConversationRef
from clarion.standins.fake_connector import FakeConnector
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many, register_recipient
from tests.support.cluster import Cluster, counts, wait_settled
from tests.support.pipeline import configure

pytestmark = pytest.mark.acceptance

CATALOG = Path(__file__).parents[1] / "catalog_outcomes.yaml"
USERS = 10


def test_a_kill_with_a_group_pending_settles_each_row_by_the_unknown_outcome_policy(
    clarion_env, tmp_path, monkeypatch
):
    configure(monkeypatch, catalog=CATALOG)
    faults = tmp_path / "faults"
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver, FakeConnector() as teams:
        env = {
            **clarion_env.env,
            "CLARION_CATALOG": str(CATALOG),
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_TEAMS_APP_ID": "none",
            "CLARION_CLAIM_LEASE": "3",
            "CLARION_SEND_TIMEOUT": "2",
            "CLARION_STRAY_AFTER": "2",
            "CLARION_TICK_INTERVAL": "0.5",
            # every send of a batch waits for one flush at its end; the first two flushes (one
            # batch per lane, run one after the other) are kills
            "CLARION_SENT_FLUSH_ROWS": "1000",
            "CLARION_SENT_FLUSH_MS": "600000",
            "CLARION_FAULTS": "deliver.before_flush=crash*2",
            "CLARION_FAULTS_DIR": str(faults),
        }
        for u in range(USERS):
            ref = ConversationRef(teams.url, f"a:conv-u{u}", "tenant-1", "bot").to_json()
            register_recipient(
                f"u{u}",
                timezone="UTC",
                addresses={"teams": f"29:u{u}", "teams_conversation": ref},
            )
        cluster = Cluster(env, tmp_path / "logs")
        try:
            cluster.worker("w1", concurrency=1)
            cluster.beat()
            # one route batch, so one deliver batch per lane: activation holds the at-most-once
            # Teams nudges and the webhook nudges, transactional the at-least-once Teams alerts
            notify_many(
                [
                    dict(user_id=f"u{u}", type_key=t, event_id="e1")
                    for u in range(USERS)
                    for t in ("nudge_teams", "nudge_webhook", "alert_teams")
                ]
            )
            settled = wait_settled(90)
        finally:
            cluster.stop()
        assert settled, "the pipeline did not settle"
    assert len(list(faults.iterdir())) == 2, "the worker was not killed at both flushes"
    states = Counter(
        (t, s) for t, s in _rows("SELECT d.type_key, d.state FROM deliveries d ORDER BY d.type_key")
    )
    incidents = Counter(
        (t, k)
        for t, k in _rows(
            "SELECT d.type_key, i.kind FROM incidents i JOIN deliveries d "
            "ON d.user_id = i.user_id AND d.id = i.delivery_id"
        )
    )
    # at-most-once on a channel that cannot dedup (Teams): held, one message, an incident each
    assert states[("nudge_teams", "unknown")] == USERS
    assert incidents[("nudge_teams", "outcome_unknown")] == USERS
    # at-least-once on it: sent again, and each possible duplicate is an incident
    assert states[("alert_teams", "sent")] == USERS
    assert incidents[("alert_teams", "possible_duplicate")] == USERS
    # the webhook dedups by key: sent again under it, and the receiver dropped the repeat (409)
    assert states[("nudge_webhook", "sent")] == USERS
    assert receiver.arrivals.unique == USERS and receiver.arrivals.repeats == USERS
    assert incidents[("nudge_webhook", "repeat")] == USERS
    assert sum(incidents.values()) == 3 * USERS
    # at the Teams connector: per recipient the nudge once, the alert twice (both counted above)
    posted = Counter(c.conversation_id for c in teams.sent)
    assert posted == {f"a:conv-u{u}": 3 for u in range(USERS)}
    assert counts("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'claimed')") == 0


def _rows(sql: str) -> list[tuple]:
    from sqlalchemy import text

    from clarion.db.engine import engine

    with engine().connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]
