"""Publishing wake-up messages (tasks/publish.py) to a Redis broker of the test's own, counted by
the broker: the messages of one publish() reach it together (kombu's publish batch: pipelined
writes, several messages a read), not one round trip per message; and they are the same
messages, each in its lane's queue."""

from __future__ import annotations

import json
from base64 import b64decode

import pytest
import redis

from clarion import settings
from clarion.tasks.publish import ROUTE, publish

pytestmark = pytest.mark.integration


def _reads(client: redis.Redis) -> int:
    """Reads the Redis server has processed from its clients' sockets (INFO stats)."""
    return int(client.info("stats")["total_reads_processed"])


def _queued(client: redis.Redis, lane: str) -> list[tuple[list[str], list[int]]]:
    found = []
    for raw in client.lrange(lane, 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == ROUTE
        users, ids = json.loads(b64decode(message["body"]))[0]
        found.append((users, ids))
    return found


def test_the_messages_of_one_publish_reach_the_broker_together(own_broker, monkeypatch):
    monkeypatch.setenv("CLARION_BATCH_SIZE", "1")  # a message per key: round trips show
    settings.reset()
    client = redis.Redis.from_url(own_broker["CLARION_BROKER_URL"])
    publish(ROUTE, [("u0", 0, "transactional")])  # the producer's connection made, queue declared
    client.delete("transactional")
    before = _reads(client)
    sent = publish(ROUTE, [(f"u{i}", i, "transactional") for i in range(400)])
    reads = _reads(client) - before - 1  # INFO's own read
    assert sent == 400
    assert reads < sent / 4, reads  # one read per message without the batch (400 measured)
    assert sorted(ids[0] for _, ids in _queued(client, "transactional")) == list(range(400))


def test_a_publish_splits_keys_by_lane_in_batches(own_broker):
    client = redis.Redis.from_url(own_broker["CLARION_BROKER_URL"])
    rows = [(f"u{i}", i, "transactional" if i % 4 else "activation") for i in range(2000)]
    assert publish(ROUTE, rows) == 15 + 5  # 1,500 keys in messages of 100, and 500
    for lane, mine in (("transactional", lambda i: i % 4), ("activation", lambda i: not i % 4)):
        batches = _queued(client, lane)
        assert all(len(ids) == 100 and users == [f"u{i}" for i in ids] for users, ids in batches)
        assert sorted(i for _, ids in batches for i in ids) == [i for i in range(2000) if mine(i)]
