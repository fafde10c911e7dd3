"""POST /v1/events under concurrency: 8 client threads (an httpx client each) against the real app
on uvicorn on a local port, real PostgreSQL and Redis.

1,000 events: 200 of them (20%) reuse an Idempotency-Key with the same body (a replay), 100 more
repeat an event id (under no key or a fresh key: `new: false`), 700 are distinct — shuffled, so a
repeat often races its original; requests with bad keys mixed in. Exactly one request row per
distinct event, each repeat answered with the first answer, one route task per request; then
changed bodies under used keys (422), and a low-rate key driven past its rate (429 with
Retry-After). Each call's start and end are recorded to show the clients were in flight at once.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from clarion.standins.fake_slack import serving
from clarion.tasks import register_recipient
from clarion.tasks.publish import ROUTE
from clarion.web.api_auth import create_key
from clarion.web.app import create_app
from tests.support.api import _broker
from tests.support.pipeline import count, published, rows

pytestmark = pytest.mark.integration
__all__ = ["_broker"]  # a fixture, from tests/support/api.py

CLIENTS = 8
USERS = [f"u{i:02d}" for i in range(20)]
EVENTS = 1000
REPLAYS = 200  # the same Idempotency-Key and body again: 20% of the events
SAME_EVENT_NO_KEY = 50  # the same event id again, without an Idempotency-Key
SAME_EVENT_NEW_KEY = 50  # the same event id again, under a key of its own
REPEATS = REPLAYS + SAME_EVENT_NO_KEY + SAME_EVENT_NEW_KEY
DISTINCT = EVENTS - REPEATS
BAD_KEYS = 40
RACING = 8  # repeats sent beside their originals (half replays, half the same event id)


@dataclass(frozen=True)
class Call:
    event: int | None  # which distinct event the body is (None: not an event of the load)
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Answer:
    call: Call
    status: int
    content: bytes
    headers: httpx.Headers
    started: float = field(repr=False)
    ended: float = field(repr=False)

    @property
    def replayed(self) -> bool:
        return self.headers.get("Idempotent-Replayed") == "true"

    def json(self) -> Any:
        return json.loads(self.content)


@pytest.fixture
def url(clarion_env) -> Iterator[str]:
    for user in USERS:
        register_recipient(user, timezone="Europe/Berlin")
    with serving(create_app()) as base:
        yield base


def body(i: int, order: str | None = None) -> dict[str, Any]:
    return {
        "event_id": f"ev-{i}",
        "user_id": USERS[i % len(USERS)],
        "type": "receipt",
        "variables": {"order": order or f"A-{i}"},
    }


def run(base: str, calls: list[Call]) -> list[Answer]:
    """Send `calls` from CLIENTS threads, each taking the next call when its last one answered."""
    pending = list(reversed(calls))
    lock, answers = threading.Lock(), []
    start = threading.Barrier(CLIENTS)

    def client() -> None:
        with httpx.Client(base_url=base, timeout=120) as http:
            start.wait()
            while True:
                with lock:
                    if not pending:
                        return
                    call = pending.pop()
                began = time.monotonic()
                got = http.post("/v1/events", json=call.body, headers=call.headers)
                done = Answer(
                    call, got.status_code, got.content, got.headers, began, time.monotonic()
                )
                with lock:
                    answers.append(done)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(answers) == len(calls), "a client thread died"
    return answers


def most_in_flight(answers: list[Answer]) -> int:
    """The largest number of calls that had been sent and not yet answered at one instant."""
    edges = sorted(
        [(a.started, 1) for a in answers] + [(a.ended, -1) for a in answers],
        key=lambda e: (e[0], e[1]),  # an answer at the instant another is sent: not overlapping
    )
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def load(secret: str) -> list[Call]:
    """The 1,000 events (700 distinct, 300 repeats of one of them) and the bad-key calls,
    shuffled."""
    auth = {"Authorization": f"Bearer {secret}"}
    keyed = lambda i: {**auth, "Idempotency-Key": f"idem-{i}"}  # noqa: E731
    # even events are sent under an Idempotency-Key, odd ones without
    calls = [Call(i, body(i), keyed(i) if i % 2 == 0 else auth) for i in range(DISTINCT)]
    pick = random.Random(12)
    evens = pick.sample(range(0, DISTINCT, 2), REPLAYS + SAME_EVENT_NEW_KEY)
    odds = pick.sample(range(1, DISTINCT, 2), SAME_EVENT_NO_KEY)
    calls += [Call(i, body(i), keyed(i)) for i in evens[:REPLAYS]]
    calls += [Call(i, body(i), {**auth, "Idempotency-Key": f"again-{i}"}) for i in evens[REPLAYS:]]
    calls += [Call(i, body(i), auth) for i in odds]
    prefix = secret.split("_")[1]
    wrong = [f"clk_{prefix}_{'A' * 43}", f"clk_{'0' * 12}_{'A' * 43}", "hunter2"]
    calls += [
        Call(None, body(DISTINCT + j), {"Authorization": f"Bearer {wrong[j % 3]}"})
        for j in range(BAD_KEYS)
    ]
    pick.shuffle(calls)
    # Some repeats side by side with their originals at the very start, where all 8 clients send
    # at once: a replay racing the request it replays, an event id racing itself.
    racing = {*evens[: RACING // 2], *odds[: RACING // 2]}
    first = sorted((c for c in calls if c.event in racing), key=lambda c: c.event or 0)
    return first + [c for c in calls if c.event not in racing]


def raced(answers: list[Answer]) -> int:
    """Distinct events two of whose calls were in flight at the same time."""
    groups = defaultdict(list)
    for a in answers:
        groups[a.call.event].append(a)
    return sum(
        any(x.started < y.ended and y.started < x.ended for x in g for y in g if x is not y)
        for event, g in groups.items()
        if event is not None
    )


def test_1000_events_with_repeats_from_8_clients_make_one_request_per_event(url):
    secret = create_key("load", ["events:write"], (100_000, 1)).secret
    calls = load(secret)
    assert sum(c.event is not None for c in calls) == EVENTS
    idempotency_keys = [
        c.headers["Idempotency-Key"] for c in calls if "Idempotency-Key" in c.headers
    ]
    assert len(idempotency_keys) - len(set(idempotency_keys)) == EVENTS // 5  # 20% reuse a key
    answers = run(url, calls)

    # overlapped: most clients were waiting on the server at the same instant
    assert most_in_flight(answers) >= CLIENTS - 2
    assert raced(answers) >= 2  # and repeats were in flight beside their originals

    bad = [a for a in answers if a.call.event is None]
    assert [a.status for a in bad] == [401] * BAD_KEYS
    assert all(a.json()["field"] == "Authorization" for a in bad)
    good = [a for a in answers if a.call.event is not None]
    assert sorted({a.status for a in good}) == [202], {a.status for a in good}

    # exactly one request row per distinct event, none for the bad-key calls
    stored = rows("SELECT user_id, occurrence_key, id FROM requests")
    assert len(stored) == DISTINCT
    by_event = {(r["user_id"], r["occurrence_key"]): r["id"] for r in stored}
    expected = {(body(i)["user_id"], f"event:ev-{i}") for i in range(DISTINCT)}
    assert set(by_event) == expected

    groups: dict[int, list[Answer]] = defaultdict(list)
    for a in good:
        groups[a.call.event].append(a)
    assert sum(len(g) > 1 for g in groups.values()) == REPEATS
    for i, group in groups.items():
        request_id = by_event[(body(i)["user_id"], f"event:ev-{i}")]
        assert {a.json()["request_id"] for a in group} == {request_id}, i
        firsts = [a for a in group if not a.replayed]
        # one answer made the request; every other answer that was not a replay says new=false
        assert sorted(a.json()["new"] for a in firsts) == [False] * (len(firsts) - 1) + [True], i
        for replay in (a for a in group if a.replayed):
            key = replay.call.headers["Idempotency-Key"]
            [first] = [a for a in firsts if a.call.headers.get("Idempotency-Key") == key]
            assert replay.content == first.content, i  # the first answer, byte for byte
    assert sum(a.replayed for a in good) == REPLAYS
    assert count("api_idempotency") == DISTINCT // 2 + SAME_EVENT_NEW_KEY

    # one route task per request: no repeat woke the router again
    woken = published("transactional")[ROUTE]
    assert sorted(woken) == sorted((user, id_) for (user, _), id_ in by_event.items())

    # a changed body under a used Idempotency-Key: 422 naming the header, nothing written
    used = range(0, 80, 2)  # even events were sent under idem-<i>
    changed = [
        Call(
            i,
            body(i, order="CHANGED"),
            {"Authorization": f"Bearer {secret}", "Idempotency-Key": f"idem-{i}"},
        )
        for i in used
    ]
    refused = run(url, changed)
    assert [a.status for a in refused] == [422] * len(changed)
    assert {(a.json()["error"], a.json()["field"]) for a in refused} == {
        ("idempotency_mismatch", "Idempotency-Key")
    }
    assert count("requests") == DISTINCT and not published("transactional")


def test_over_the_keys_rate_from_8_clients_is_a_429_with_retry_after(url):
    rate = 30
    secret = create_key("slow", ["events:write"], (rate, 3600)).secret
    auth = {"Authorization": f"Bearer {secret}"}
    answers = run(url, [Call(i, body(i), auth) for i in range(100)])
    assert most_in_flight(answers) >= CLIENTS - 2

    accepted = [a for a in answers if a.status == 202]
    over = [a for a in answers if a.status == 429]
    assert (len(accepted), len(over)) == (rate, 100 - rate)  # the budget is exact under races
    for a in over:
        assert a.json() == {
            "error": "rate_limited",
            "field": None,
            "reason": f"over this key's rate of {rate} per 3600s",
        }
        assert 3000 <= int(a.headers["Retry-After"]) <= 3600  # the oldest of the 30 ages out
    # only the accepted events were written
    stored = {r["occurrence_key"] for r in rows("SELECT occurrence_key FROM requests")}
    assert stored == {f"event:{a.call.body['event_id']}" for a in accepted}
    # another key is not slowed down by this one's budget
    other = create_key("other", ["events:write"]).secret
    fresh = httpx.post(
        url + "/v1/events", json=body(500), headers={"Authorization": f"Bearer {other}"}
    )
    assert fresh.status_code == 202
