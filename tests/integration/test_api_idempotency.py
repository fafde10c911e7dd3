"""Idempotency-Key on POST /v1/events[/batch]: replay, mismatch, scope per API key, nothing stored
for a refused request, retention on the injected clock, and two requests under one key at the
same instant against a real uvicorn server (the second shown blocked on the first's transaction).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import httpx
import pytest
import uvicorn
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.tasks.publish import ROUTE
from clarion.web.api_ingest import WRITER
from clarion.web.app import create_app
from tests.support.api import _broker, ann, bearer, client, event, refused, written
from tests.support.pipeline import count, frozen_clock, published, rows

pytestmark = pytest.mark.integration
__all__ = ["_broker", "ann", "client"]  # fixtures, from tests/support/api.py


def test_the_same_key_and_body_get_the_first_answer_again(client, ann):
    headers = {**bearer(), "Idempotency-Key": "order-A-1"}
    first = client.post("/v1/events", json=event(), headers=headers)
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    assert published("transactional")[ROUTE] == [("ann", first.json()["request_id"])]
    # the same JSON written differently (key order, spaces) is the same request
    same = json.dumps(dict(reversed(list(event().items()))), indent=2)
    again = client.post(
        "/v1/events", content=same, headers={**headers, "Content-Type": "application/json"}
    )
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content  # byte for byte, `new: true` included
    assert count("requests") == 1 and count("api_idempotency") == 1
    assert not published("transactional")  # no second wake-up


def test_the_same_key_with_another_body_or_path_is_a_422(client, ann):
    headers = {**bearer(), "Idempotency-Key": "k1"}
    assert client.post("/v1/events", json=event(), headers=headers).status_code == 202
    before = written()
    other = client.post("/v1/events", json=event(event_id="e2"), headers=headers)
    assert refused(other, 422, "Idempotency-Key")["error"] == "idempotency_mismatch"
    batch = client.post("/v1/events/batch", json={"items": [event()]}, headers=headers)
    refused(batch, 422, "Idempotency-Key")
    assert written() == before


def test_keys_are_scoped_per_api_key(client, ann):
    one, two = bearer(), bearer()
    first = client.post("/v1/events", json=event(), headers={**one, "Idempotency-Key": "k"})
    # another API key, the same Idempotency-Key and a different body: not a mismatch
    other = client.post(
        "/v1/events", json=event(event_id="e2"), headers={**two, "Idempotency-Key": "k"}
    )
    assert (first.status_code, other.status_code) == (202, 202)
    assert "Idempotent-Replayed" not in other.headers and other.json()["new"] is True
    assert count("api_idempotency") == 2


def test_a_refused_request_stores_nothing_so_the_key_can_be_retried(client, ann):
    headers = {**bearer(), "Idempotency-Key": "fix-me"}
    before = written()
    refused(client.post("/v1/events", json=event(variables={}), headers=headers), 422, "variables")
    batch = {"items": [event(), event(event_id="e2", user_id="zed")]}
    refused(client.post("/v1/events/batch", json=batch, headers=headers), 422, "items[1].user_id")
    assert written() == before  # neither the requests nor the key's row: one transaction
    fixed = client.post("/v1/events", json=event(), headers=headers)
    assert fixed.status_code == 202 and "Idempotent-Replayed" not in fixed.headers
    assert count("api_idempotency") == 1 and count("requests") == 1


def test_a_malformed_key_is_a_400_naming_the_header(client, ann):
    before = written()
    for bad in ("", "x" * 256):
        answer = client.post(
            "/v1/events", json=event(), headers={**bearer(), "Idempotency-Key": bad}
        )
        assert refused(answer, 400, "Idempotency-Key")["error"] == "invalid_header"
    assert written() == before


def test_keys_are_kept_24_hours_then_free_and_purged(client, ann):
    headers = {**bearer(), "Idempotency-Key": "daily"}
    with frozen_clock() as clock:
        assert client.post("/v1/events", json=event(), headers=headers).status_code == 202
        client.post(
            "/v1/events", json=event(event_id="x"), headers={**headers, "Idempotency-Key": "old"}
        )
        clock.advance(timedelta(hours=23, minutes=59).total_seconds())
        refused(
            client.post("/v1/events", json=event(event_id="e2"), headers=headers),
            422,
            "Idempotency-Key",
        )
        clock.advance(120)  # past 24 h: the key is free again, the request is still recognised
        later = client.post("/v1/events", json=event(), headers=headers)
        assert later.status_code == 202 and "Idempotent-Replayed" not in later.headers
        assert later.json()["new"] is False  # the ledger's own dedup has no retention
        assert count("requests") == 2
        # the taken-over row is fresh; the other expired one was purged by this request
        assert rows("SELECT key FROM api_idempotency") == [{"key": "daily"}]
        again = client.post("/v1/events", json=event(event_id="e2"), headers=headers)
        refused(again, 422, "Idempotency-Key")  # the new answer is the one kept now


# --- two at once ------------------------------------------------------------------------------


@contextmanager
def serving() -> Iterator[str]:
    """The app on a real socket (uvicorn in a thread), so requests are served concurrently."""
    server = uvicorn.Server(
        uvicorn.Config(create_app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


_WAITING = text(
    "SELECT pid, pg_blocking_pids(pid) AS blockers, query FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


def _blocked_behind(holder: int) -> dict | None:
    """The ingest transaction once it waits on `holder`'s lock."""
    with engine().connect() as conn:
        waiting = [dict(r) for r in conn.execute(_WAITING).mappings()]
    return next((w for w in waiting if w["blockers"] == [holder]), None)


def test_two_requests_under_one_key_at_once_make_one_request_and_one_answer(ann):
    headers = {**bearer(), "Idempotency-Key": "race"}
    answers: list[httpx.Response] = []

    def post() -> None:
        answers.append(httpx.post(url + "/v1/events", json=event(), headers=headers, timeout=60))

    with serving() as url, engine().connect() as holder:
        # Hold off writes to requests, so whichever request takes the key first stops inside the
        # shared transaction at the requests insert (it waits for this lock), holding the key;
        # the other request waits meanwhile, handed to the same writer.
        holder.execute(text("LOCK TABLE requests IN SHARE MODE"))
        holder_pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        clients = [threading.Thread(target=post) for _ in range(2)]
        for c in clients:
            c.start()
        deadline, winner = time.monotonic() + 30, None
        while winner is None or WRITER.queued() < 2:
            assert time.monotonic() < deadline, "the two requests never overlapped"
            time.sleep(0.01)
            winner = _blocked_behind(holder_pid)
        assert "INSERT INTO requests" in winner["query"]  # holding the key, writing the request
        assert WRITER.queued() == 2 and not answers  # both in, neither answered
        holder.rollback()  # let the winner go on
        for c in clients:
            c.join(60)
    assert [a.status_code for a in answers] == [202, 202]
    assert answers[0].content == answers[1].content
    assert sorted(a.headers.get("Idempotent-Replayed", "-") for a in answers) == ["-", "true"]
    request_id = answers[0].json()["request_id"]
    assert count("requests") == 1 and count("api_idempotency") == 1
    assert published("transactional")[ROUTE] == [("ann", request_id)]
