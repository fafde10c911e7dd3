"""Broadcast progress as outbound events (issue 25 item 1, issue 28): written by the trigger of
migration 0026 in the transaction of the chunk or cancel that changed the broadcast, delivered
to the app's endpoint stand-in (standins/fake_app_endpoint.py), signed, in order, and counted
there: started, a progress event per tenth of the plan, then done or cancelled; a chunk that
rolls back leaves no event, and a repeat after a failed attempt carries the same webhook-id."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from clarion.errors import FaultInjected
from clarion.standins.fake_app_endpoint import FakeAppEndpoint
from clarion.standins.receiver import Receiver
from clarion.tasks import event_endpoints
from clarion.tasks.broadcasts import broadcast, cancel_broadcast, fan_out
from clarion.tasks.events import backoff, dispatch
from tests.support.api import _broker
from tests.support.broadcasts import join, recipients, use_broadcast_catalog, work
from tests.support.pipeline import configure, frozen_clock, rows, webhook_receiver

pytestmark = pytest.mark.integration
__all__ = ["_broker"]  # the fixture, from tests/support/api.py
KINDS = ["broadcast.started", "broadcast.progress", "broadcast.done", "broadcast.cancelled"]


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    use_broadcast_catalog(monkeypatch)
    with webhook_receiver(monkeypatch) as running:
        yield running


@pytest.fixture
def app(receiver) -> Iterator[FakeAppEndpoint]:
    with FakeAppEndpoint([]) as endpoint:
        made = event_endpoints.create(endpoint.url, KINDS)
        endpoint.state.secrets.append(made.secret)
        yield endpoint


def _events() -> list[tuple[str, int, str]]:
    found = rows("SELECT kind, data, stream FROM outbound_events ORDER BY id")
    return [(e["kind"], e["data"]["requested"], e["stream"]) for e in found]


@pytest.mark.parametrize("fills", [1, 2])
def test_a_broadcast_reports_start_each_tenth_and_done_to_the_endpoint(
    app, receiver, monkeypatch, fills
):
    join("news", recipients("us", 25))
    configure(monkeypatch, broadcast_fills=fills)
    started = broadcast("notice", {"topic": "news"}, idempotency_key="k-25")
    while fan_out(started.id, chunk=5, seconds=0):  # one step a call, as a slow fan-out would
        pass
    stream = f"b:{started.id}"
    # the same events whether a step writes its chunks one at a time or two at once: each chunk
    # adds to `requested` in its own commit, and the step's end says done
    assert _events() == [
        ("broadcast.started", 5, stream),
        ("broadcast.progress", 5, stream),
        ("broadcast.progress", 10, stream),
        ("broadcast.progress", 15, stream),
        ("broadcast.progress", 20, stream),
        ("broadcast.progress", 25, stream),
        ("broadcast.done", 25, stream),
    ]
    dispatch()
    taken = app.state.taken()
    assert [a.payload["type"] for a in taken] == [e[0] for e in _events()]  # in stream order
    assert all(a.matched == (0,) for a in taken)  # signed with the endpoint's secret
    data = [a.payload["data"] for a in taken]
    assert [d["percent"] for d in data] == [20, 20, 40, 60, 80, 100, 100]
    assert {(d["broadcast_id"], d["type"], d["occurrence_key"]) for d in data} == {
        (started.id, "notice", f"broadcast:{started.id}")
    }
    assert {d["user_id"] for d in data} == {None} and data[-1]["state"] == "done"
    assert data[0]["idempotency_key"] == "k-25" and data[-1]["planned"] == 25
    assert len({a.msg_id for a in taken}) == 7  # one stable id per event
    work()
    assert receiver.arrivals.unique == 25  # the broadcast itself went out


@pytest.mark.parametrize("fills", [1, 2])
def test_a_chunk_that_rolls_back_writes_no_event_and_its_retry_writes_each_once(
    app, monkeypatch, fills
):
    join("news", recipients("us", 10))
    started = broadcast("notice", {"topic": "news"})
    configure(monkeypatch, faults="broadcast.before_commit=raise*1", broadcast_fills=fills)
    with pytest.raises(FaultInjected, match="broadcast.before_commit"):
        fan_out(started.id, chunk=5)
    # the chunk's requests and events went together: none of the one that died; with two at
    # once, the other one's
    assert _events() == (
        []
        if fills == 1
        else [
            ("broadcast.started", 5, f"b:{started.id}"),
            ("broadcast.progress", 5, f"b:{started.id}"),
        ]
    )
    configure(monkeypatch, faults="", broadcast_fills=fills)
    assert fan_out(started.id, chunk=5) == (10 if fills == 1 else 5)
    assert _events()[-3:] == [
        ("broadcast.progress", 5, f"b:{started.id}"),
        ("broadcast.progress", 10, f"b:{started.id}"),
        ("broadcast.done", 10, f"b:{started.id}"),
    ]
    assert [kind for kind, *_ in _events()].count("broadcast.started") == 1


def test_a_cancel_reports_what_went_and_a_failed_attempt_repeats_under_the_same_id(app, receiver):
    join("news", recipients("us", 40))
    started = broadcast("notice", {"topic": "news"})
    assert fan_out(started.id, chunk=15, seconds=0) == 30  # one step: two chunks at once
    stopped = cancel_broadcast(started.id)
    assert fan_out(started.id, chunk=15) == 0  # nothing more after the cancel
    work()
    assert stopped.requested == 30 == receiver.arrivals.unique  # counted at the receiver
    with frozen_clock(datetime.now(UTC)) as clock:
        app.state.script("500")
        dispatch(clock.read)  # "started" refused: nothing after it goes
        clock.advance(backoff(1).total_seconds() + 10)
        dispatch(clock.read)
    arrivals = app.state.snapshot()
    assert [(a.payload["type"], a.answer) for a in arrivals] == [
        ("broadcast.started", "500"),
        ("broadcast.started", "204"),
        ("broadcast.progress", "204"),
        ("broadcast.progress", "204"),
        ("broadcast.cancelled", "204"),
    ]
    assert arrivals[0].msg_id == arrivals[1].msg_id
    cancelled = arrivals[-1].payload["data"]
    assert (cancelled["state"], cancelled["requested"], cancelled["percent"]) == (
        "cancelled",
        30,
        75,
    )


def test_no_endpoint_for_broadcast_kinds_means_no_event_row(receiver):
    event_endpoints.create("http://127.0.0.1:9/x", ["delivery.sent"])
    join("news", recipients("us", 3))
    started = broadcast("notice", {"topic": "news"})
    fan_out(started.id)
    assert rows("SELECT kind FROM outbound_events WHERE stream LIKE 'b:%'") == []
