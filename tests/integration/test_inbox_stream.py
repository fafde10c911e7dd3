"""The inbox over real HTTP: clarion's ASGI app under uvicorn in a thread, httpx (and httpx-sse,
an independent SSE parser) as the page. An item sent while a stream is open arrives on it within
a second; a collapse follower arrives as `updated`; a resumed stream (Last-Event-ID) sends what
it missed; tokens are checked first (401) and bad input is a 400 naming the field."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from httpx_sse import connect_sse

from clarion.tasks import register_recipient
from clarion.tasks.inbox import inbox_token
from tests.support.inbox import items, routed, send
from tests.support.pipeline import configure, frozen_clock, publishing_to_this_tests_broker

pytestmark = pytest.mark.integration
CATALOG = Path(__file__).parents[1] / "catalog_inapp.yaml"


@pytest.fixture
def web(clarion_env, monkeypatch) -> Iterator[str]:
    # a heartbeat (when a stream also re-reads its changes) far longer than the test: what
    # arrives, arrives through NOTIFY
    configure(monkeypatch, catalog=CATALOG, inbox_heartbeat=30)
    register_recipient("ana", timezone="UTC")
    from clarion.web.app import create_app

    config = uvicorn.Config(
        create_app(), host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    with publishing_to_this_tests_broker():
        yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    assert not thread.is_alive(), "uvicorn did not stop: a stream outlived its client"


class Stream:
    """An open SSE stream read on a thread: events land in `events` as they arrive."""

    def __init__(self, base: str, user: str, *, last_event_id: str | None = None) -> None:
        self.events: queue.Queue = queue.Queue()
        self.response: httpx.Response | None = None
        self.client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        headers = {"Authorization": f"Bearer {inbox_token(user, 600)}"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.url, self.headers = f"{base}/v1/inbox/{user}/stream", headers
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            with connect_sse(self.client, "GET", self.url, headers=self.headers) as source:
                self.response = source.response
                self.events.put(("status", source.response.status_code, None))
                for sse in source.iter_sse():
                    if not sse.data:  # a `: ping` comment (httpx-sse hands blocks without data)
                        self.events.put(("ping", None, None))
                        continue
                    self.events.put((sse.event, json.loads(sse.data), sse.id))
        except httpx.HTTPError:  # closed by the test
            pass

    def next(self, kind: str, timeout: float = 5.0) -> tuple[dict, str, float]:
        """The next event of `kind` (others skipped): its data, id and when it arrived."""
        deadline = time.monotonic() + timeout
        while True:
            event, data, event_id = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event == kind:
                return data, event_id, time.monotonic()

    def close(self) -> None:
        if self.response is not None:
            self.response.close()
        self.client.close()  # (a read blocked on the socket ends when the server goes: teardown)


def test_an_item_arrives_on_an_open_stream_within_a_second(web):
    stream = Stream(web, "ana")
    try:
        assert stream.next("status")[0] == 200
        stream.next("ready")
        started = time.monotonic()
        send("ana", "inbox_note", "e1", n="1")
        data, event_id, arrived = stream.next("item", timeout=5)
        assert arrived - started < 1.0
        assert data["title"] == "Note 1" and data["count"] == 1
        assert data["id"] == items()[0]["id"] and event_id
    finally:
        stream.close()


def test_a_collapse_follower_arrives_as_updated_and_a_resume_sends_what_was_missed(web):
    stream = Stream(web, "ana")
    try:
        stream.next("ready")
        send("ana", "inbox_alert", "a0", host="h0", cluster="prod")
        first, first_id, _ = stream.next("item")
        routed("ana", "inbox_alert", "a1", host="h1", cluster="prod")
        updated, _, _ = stream.next("updated")
        assert updated["id"] == first["id"] and updated["count"] == 2 and updated["more"] == 1
    finally:
        stream.close()
    # offline: another item and another follower; a stream resumed after `first` gets both
    send("ana", "inbox_note", "e2", n="2")
    routed("ana", "inbox_alert", "a2", host="h2", cluster="prod")
    resumed = Stream(web, "ana", last_event_id=first_id)
    try:
        resumed.next("ready")
        got = {}
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            event, data, _ = resumed.events.get(timeout=5)
            if event in ("item", "updated"):
                got[data["id"]] = (event, data["count"])
        assert got[first["id"]] == ("updated", 3)
        [(kind, count)] = [v for k, v in got.items() if k != first["id"]]
        assert (kind, count) == ("item", 1)
    finally:
        resumed.close()


def test_a_stream_sends_heartbeats(web, monkeypatch):
    configure(monkeypatch, inbox_heartbeat=0.2)
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "GET", f"{web}/v1/inbox/ana/stream", params={"token": inbox_token("ana", 60)}
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        seen = ""
        for chunk in response.iter_text():
            seen += chunk
            if ": ping" in seen:
                break
        assert "event: ready" in seen and ": ping" in seen


def test_the_feed_and_marks_over_http(web):
    send("ana", "inbox_note", "e1", n="1")
    send("ana", "inbox_note", "e2", n="2")
    auth = {"Authorization": f"Bearer {inbox_token('ana', 60)}"}
    with httpx.Client(base_url=web, headers=auth, timeout=10) as client:
        page = client.get("/v1/inbox/ana", params={"limit": 1}).json()
        assert [i["title"] for i in page["items"]] == ["Note 2"] and page["unread"] == 2
        older = client.get("/v1/inbox/ana", params={"before": page["next"]}).json()
        assert [i["title"] for i in older["items"]] == ["Note 1"]
        marked = client.post(
            "/v1/inbox/ana/mark", json={"as": "read", "ids": [page["items"][0]["id"]]}
        )
        assert marked.status_code == 200 and marked.json()["unread"] == 1
        everything = client.post("/v1/inbox/ana/mark", json={"as": "read", "all": True})
        assert everything.json() == {"changed": [older["items"][0]["id"]], "unread": 0}


@pytest.mark.parametrize(
    "token",
    [None, "", "inb1.9999999999.AAAA", "garbage", "expired", "bob's"],
)
@pytest.mark.parametrize("path", ["", "/stream", "/mark"])
def test_a_missing_bad_expired_or_foreign_token_is_401_and_writes_nothing(web, token, path):
    send("ana", "inbox_note", "e1", n="1")
    if token == "expired":
        with frozen_clock() as clock:
            clock.advance(-120)
            token = inbox_token("ana", 60)
    elif token == "bob's":
        token = inbox_token("bob", 60)
    params = {"token": token} if token is not None else {}
    with httpx.Client(base_url=web, timeout=10) as client:
        if path == "/mark":
            response = client.post(
                f"/v1/inbox/ana{path}", params=params, json={"as": "read", "all": True}
            )
        else:
            response = client.get(f"/v1/inbox/ana{path}", params=params)
    assert response.status_code == 401 and response.json() == {
        "error": "missing or bad inbox token"
    }
    assert items()[0]["read_at"] is None


@pytest.mark.parametrize(
    ("path", "body", "params", "field"),
    [
        ("", None, {"limit": "0"}, "limit"),
        ("", None, {"limit": "abc"}, "limit"),
        ("", None, {"before": "-1"}, "before"),
        ("", None, {"archived": "yes"}, "archived"),
        ("/stream", None, {"last_event_id": "x"}, "Last-Event-ID"),
        ("/mark", b"not json", {}, "body"),
        ("/mark", b"[]", {}, "body"),
        ("/mark", b'{"as": "deleted", "ids": [1]}', {}, "as"),
        ("/mark", b'{"as": "read"}', {}, "ids"),
        ("/mark", b'{"as": "read", "ids": [1, "2"]}', {}, "ids[1]"),
        ("/mark", b'{"as": "read", "ids": [true]}', {}, "ids[0]"),
        ("/mark", b'{"as": "seen", "all": true}', {}, "all"),
    ],
)
def test_malformed_input_is_a_400_naming_the_field(web, path, body, params, field):
    send("ana", "inbox_note", "e1", n="1")
    params = {**params, "token": inbox_token("ana", 60)}
    with httpx.Client(base_url=web, timeout=10) as client:
        if body is not None:
            response = client.post(f"/v1/inbox/ana{path}", params=params, content=body)
        else:
            response = client.get(f"/v1/inbox/ana{path}", params=params)
    assert response.status_code == 400
    assert response.json()["error"].startswith(field)
    assert items()[0]["read_at"] is None and items()[0]["seen_at"] is None
