"""Collapse in place with real processes: the beat tick (which publishes the refresh job when an
update is due) and a worker keep a
collapse leader's Slack message showing its group's count, then close it, on the wall clock
(a 3 s window, updates at most every 1 s), against the local Slack."""

from __future__ import annotations

from pathlib import Path

import pytest

from clarion.ops import launch
from clarion.standins.fake_slack import FakeSlack
from clarion.tasks import notify, notify_many, register_recipient
from tests.support.cluster import Cluster, counts
from tests.support.pipeline import configure

pytestmark = pytest.mark.acceptance

CATALOG = """
types:
  cpu_alert:
    category: alert
    channels: [slack]
    required: [host]
    options:
      collapse: {key: "cpu", window_seconds: 3, update_seconds: 1}
    templates:
      - version: 1
        title: "{{ collapsed_count }} hosts{{ ' (and counting)' if collapse_open else '' }}"
        body: "first: {{ host }}"
"""


def _owed_or_leased() -> int:
    return counts(
        "SELECT count(*) FROM collapse_refreshes WHERE due_at IS NOT NULL OR lease_until IS NOT NULL"
    )


def _titles(fake: FakeSlack) -> list[str]:
    return [t.split("\n")[0] for p in fake.posts() for t in p.update_texts]


def test_beat_and_a_worker_update_the_leader_in_place_and_close_it(
    clarion_env, tmp_path: Path, monkeypatch
):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    with FakeSlack() as fake:
        slack = {"catalog": catalog, "slack_token": FakeSlack.TOKEN, "slack_api_url": fake.api_url}
        configure(monkeypatch, **slack)
        env = {
            **clarion_env.env,
            **{f"CLARION_{k.upper()}": str(v) for k, v in slack.items()},
            "CLARION_TICK_INTERVAL": "0.2",
        }
        cluster = Cluster(env, tmp_path / "logs")
        cluster.worker("lanes", ["transactional", "activation", "control"], concurrency=2)
        cluster.beat()
        try:
            register_recipient("ana", timezone="UTC", addresses={"slack": "U1"})
            notify("ana", "cpu_alert", event_id="h0", variables={"host": "h0"})
            assert launch.wait_until(lambda: len(fake.posts()) == 1, 60, 0.1)
            notify_many(
                [
                    dict(
                        user_id="ana",
                        type_key="cpu_alert",
                        event_id=f"h{n}",
                        variables={"host": f"h{n}"},
                    )
                    for n in range(1, 4)
                ]
            )
            assert launch.wait_until(lambda: "4 hosts (and counting)" in _titles(fake), 30, 0.1)
            assert launch.wait_until(lambda: _titles(fake)[-1:] == ["4 hosts"], 30, 0.1)
            # Not a guessed quiet spell: an update comes only from an owed row, and the job sets
            # the message before it lets its row go (db.refresh.finish). So once no row is owed
            # or leased, every update there will be has been made.
            assert launch.wait_until(lambda: _owed_or_leased() == 0, 30, 0.1)
        finally:
            cluster.stop()
    assert _titles(fake) == ["4 hosts (and counting)", "4 hosts"]
    assert len(fake.posts()) == 1
    assert counts("SELECT count(*) FROM decisions WHERE reason = 'collapsed'") == 3
    assert counts("SELECT count(*) FROM collapse_refreshes WHERE due_at IS NOT NULL") == 0
