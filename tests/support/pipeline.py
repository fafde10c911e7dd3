"""Helpers for integration tests that drive the pipeline in-process: settings, clock, row counts,
metric counts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import kombu.pools
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from clarion import clock, faults, settings
from clarion.db.engine import engine
from clarion.standins.receiver import Receiver
from clarion.tasks import producer, runtime
from clarion.tasks.app import app
from clarion.web import scrape


def configure(monkeypatch: pytest.MonkeyPatch, **values: Any) -> None:
    """Set CLARION_<NAME> variables (None removes one) and make this process read them again."""
    for name, value in values.items():
        key = f"CLARION_{name.upper()}"
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, str(value))
    settings.reset()
    faults.reset()
    runtime.reset()


class Clock:
    """A clock that moves only when told to, or by `step` seconds after every reading."""

    def __init__(self, start: datetime) -> None:
        self.now = start
        self.step = 0.0

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def read(self) -> datetime:
        reading = self.now
        if self.step:
            self.advance(self.step)
        return reading


@contextmanager
def webhook_receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """The real webhook receiver (standins/receiver.py), as the default webhook URL."""
    with Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        yield running


@contextmanager
def frozen_clock(start: datetime | None = None) -> Iterator[Clock]:
    """Drive clarion.clock from a Clock for the duration; always restores the system clock."""
    fixed = Clock(start or datetime.now(UTC))
    clock.set_source(fixed.read)
    try:
        yield fixed
    finally:
        clock.set_source(None)


def count(table: str, where: str = "true", **params: Any) -> int:
    with engine().connect() as conn:
        return conn.execute(
            text(f"SELECT count(*) FROM {table} WHERE {where}"), params
        ).scalar_one()


def rows(sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine().connect() as conn:
        return [dict(r) for r in conn.execute(text(sql), params).mappings()]


def counted(name: str, **labels: str) -> float:
    """The sum of /metrics samples `name` whose labels include `labels` (this host's counters,
    every process's): compare before and after a call."""
    body, _ = scrape.exposition()
    return sum(
        s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == want for k, want in labels.items())
    )


def counts() -> dict[str, int]:
    """Rows in every ledger table: compare before and after a call that must write nothing."""
    tables = ("recipients", "requests", "deliveries", "decisions", "incidents")
    return {t: count(t) for t in tables}


@contextmanager
def publishing_to_this_tests_broker() -> Iterator[None]:
    """Point the Celery app at the broker of the settings in force, for the duration.

    celeryconfig reads settings when the Celery app first loads its configuration, and pytest's
    collection of any module that imports a task proxy (e.g. `from tasks.route import route`)
    triggers that before a fixture has set CLARION_*: the app then publishes to whatever services
    the bare environment named (a developer's embedded services in ./.clarion, say), not to the
    test's Redis. test_pipeline.py has the test that shows it; this keeps the other tests honest.
    """
    wanted, saved = settings.get().urls()[2], app.conf.broker_url

    def point_at(url: str) -> None:
        kombu.pools.reset()  # closes pooled connections to the old broker
        app._after_fork()  # and Celery forgets its producer pool
        app.conf.broker_url = url

    if wanted == saved:
        yield
        return
    point_at(wanted)
    try:
        yield
    finally:
        point_at(saved)


def drain(queue: str) -> list[tuple[str, list[str], list[int]]]:
    """Take every message waiting in a lane's broker queue: (task name, users, ids) each, oldest
    first. Works on any kombu broker (Redis, RabbitMQ).

    Integration tests run no worker, so what the code published is still there to be read. What
    HTTP ingest handed to its publishing thread is published first (producer.publishing_settled)."""
    assert producer.publishing_settled(30), "the publishing thread did not finish within 30 s"
    messages = []
    with kombu.Connection(settings.get().urls()[2]) as conn:
        waiting = conn.SimpleQueue(queue)
        try:
            while True:
                try:
                    message = waiting.get(block=False)
                except waiting.Empty:
                    break
                args, _kwargs, _embed = message.decode()
                messages.append((message.headers["task"], list(args[0]), list(args[1])))
                message.ack()
        finally:
            waiting.close()
    return messages


def published(queue: str) -> dict[str, list[tuple[str, int]]]:
    """Drain `queue`: the (user_id, id) keys published per task name, in order (missing task: [])."""
    keys: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, users, ids in drain(queue):
        keys[name].extend(zip(users, ids, strict=True))
    return keys


def expire_lease(key: tuple[str, int]) -> None:
    """What the passing of a claim's lease looks like: leases live on PostgreSQL's clock, so a
    test moves the lease, not an injected clock."""
    with engine().begin() as conn:
        conn.execute(
            text(
                "UPDATE deliveries SET lease_until = clock_timestamp() - interval '1 second', "
                "due_at = clock_timestamp() - interval '1 second' "
                "WHERE user_id = :u AND id = :id"
            ),
            {"u": key[0], "id": key[1]},
        )
