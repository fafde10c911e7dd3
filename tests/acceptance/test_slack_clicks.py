"""Two real processes click different answers on the same Slack message at the same instant.

Each process runs the whole web stack itself (Starlette app, Bolt with signature verification,
handle_click against PostgreSQL, chat.update against the local Slack), as two web workers would.
For 200 deliveries: exactly one answer each, both processes show that answer, and the message's
last update in place carries that answer's catalog label. Once through clarion's own endpoint, and
once through a host's own Bolt App with clarion's handlers registered.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import Counter
from collections.abc import Iterator

import pytest
from slack_bolt import App
from slack_bolt.adapter.starlette import SlackRequestHandler
from slack_sdk import WebClient
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from clarion.standins.fake_slack import FakeSlack, block_actions, signed
from clarion.tasks import notify_many, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.web import slack as web_slack
from clarion.web.app import create_app
from tests.support.environment import ROOT
from tests.support.pipeline import configure, drain, publishing_to_this_tests_broker, rows
from tests.support.race import race

pytestmark = pytest.mark.acceptance

N = 200
SECRET = "clarion-signing-secret"
HOST_SECRET = "host-signing-secret"
ANSWERS = ("grow_team", "ship_faster")  # process 0 clicks the first, process 1 the second
LABELS = {"grow_team": "Grow my team", "ship_faster": "Ship faster"}


@pytest.fixture
def fake(clarion_env, monkeypatch) -> Iterator[FakeSlack]:
    with FakeSlack() as server, publishing_to_this_tests_broker():
        configure(
            monkeypatch,
            catalog=ROOT / "catalog" / "examples" / "activation.yaml",
            slack_token=FakeSlack.TOKEN,
            slack_api_url=server.api_url,
            slack_signing_secret=SECRET,
        )
        yield server


def _sent_nudges(fake: FakeSlack) -> list[dict]:
    """N managers, each with one goal prompt posted on Slack (by the route, which sends what it
    routes in-process)."""
    for n in range(N):
        register_recipient(f"m{n:03d}", timezone="UTC", addresses={"slack": f"U{n:03d}"})
    requests = notify_many(
        [
            dict(
                user_id=f"m{n:03d}",
                type_key="goal_prompt",
                event_id="q3",
                variables={"first_name": "Sam"},
            )
            for n in range(N)
        ]
    )
    users = [f"m{n:03d}" for n in range(N)]
    assert route(users, [r.request_id for r in requests]) == N
    drain("activation")
    sent = rows(
        "SELECT d.user_id, d.id, d.state, d.provider_message_id, rc.addresses ->> 'slack' AS slack"
        " FROM deliveries d JOIN recipients rc USING (user_id) ORDER BY d.id"
    )
    assert len(sent) == N and {r["state"] for r in sent} == {"sent"}  # the route sent them all
    assert len(fake.posts()) == N
    assert deliver([r["user_id"] for r in sent], [r["id"] for r in sent]) == 0  # none left
    return [{k: v for k, v in r.items() if k != "state"} for r in sent]


def _host_app(api_url: str) -> Starlette:
    """A host's own bot: its Bolt App, its own route, clarion's handlers registered on it. (It
    finishes listeners before answering, so the process can exit right after its last click.)"""
    host = App(
        client=WebClient(token=FakeSlack.TOKEN, base_url=api_url),
        signing_secret=HOST_SECRET,
        token_verification_enabled=False,
        process_before_response=True,
    )
    web_slack.register(host)
    return Starlette(
        routes=[Route("/host/slack", SlackRequestHandler(host).handle, methods=["POST"])]
    )


def _click_all(which: int, targets: list[dict], barrier, mount: str, api_url: str) -> list[int]:
    """One process: click answer ANSWERS[which] on every message, in step with the other process."""
    if mount == "own":
        client, path, secret = TestClient(create_app()), "/slack/events", SECRET
    else:
        client, path, secret = TestClient(_host_app(api_url)), "/host/slack", HOST_SECRET
    statuses = []
    for t in targets:
        channel, ts = t["provider_message_id"].split(":")
        value = json.dumps(
            {"u": t["user_id"], "d": t["id"], "a": ANSWERS[which]}, separators=(",", ":")
        )
        body = block_actions(
            t["slack"], value, action_id=f"clarion:{ANSWERS[which]}", channel=channel, ts=ts
        )
        headers = signed(secret, body, content_type="application/x-www-form-urlencoded")
        barrier.wait(timeout=60)  # both processes post this message's click at the same instant
        statuses.append(client.post(path, content=body, headers=headers).status_code)
    return statuses


@pytest.mark.parametrize("mount", ["own", "host"])
def test_two_processes_clicking_different_answers_record_exactly_one_and_show_it(fake, mount):
    targets = _sent_nudges(fake)
    barrier = mp.get_context("fork").Barrier(2)
    statuses = race(2, _click_all, lambda i: (i, targets, barrier, mount, fake.api_url))
    assert statuses.most_at_once() == 2  # both clickers were clicking at once
    assert statuses == [[200] * N, [200] * N]

    answered = {r["id"]: r for r in rows("SELECT id, state, answer FROM deliveries")}
    assert {r["state"] for r in answered.values()} == {"answered"}
    clicks = rows("SELECT delivery_id, outcome, answer FROM interactions")
    assert len(clicks) == 2 * N
    per_delivery = Counter((c["delivery_id"], c["outcome"]) for c in clicks)
    assert set(per_delivery.values()) == {1}  # one accepted and one repeated for every delivery
    assert {c["answer"] for c in clicks if c["outcome"] == "accepted"} <= set(ANSWERS)
    for c in clicks:
        if c["outcome"] == "accepted":
            assert answered[c["delivery_id"]]["answer"] == c["answer"]

    for t in targets:
        channel, ts = t["provider_message_id"].split(":")
        label = LABELS[answered[t["id"]]["answer"]]
        updates = fake.message(channel, ts).updates
        assert len(updates) == 2  # one chat.update from each process ...
        for blocks in updates:  # ... both showing the one recorded answer, the last one included
            assert [e["text"] for b in blocks if b["type"] == "context" for e in b["elements"]] == [
                f"Answered: {label}"
            ]
            assert "actions" not in [b["type"] for b in blocks]
    wins = Counter(r["answer"] for r in answered.values())
    print(f"\n{mount}: first answers won per process: {dict(wins)}")
