"""Publishing wake-up messages (tasks/publish.py) to a Redis broker of the test's own, counted by
the broker: the messages of one publish() reach it together (kombu's publish batch: pipelined
writes, several messages a read), not one round trip per message; and they are the same
messages, each in its lane's queue."""

from __future__ import annotations

import json
import logging
from base64 import b64decode

import pytest
import redis

from clarion import settings
from clarion.tasks.publish import ROUTE, publish
from tests.support.environment import use_only
from tests.support.services import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(own_redis, private_redis, monkeypatch) -> RedisServer:
    """private_redis as clarion's Redis and its broker, to count what it served and to stop and
    start."""
    use_only(monkeypatch, {**own_redis, "CLARION_BROKER_URL": private_redis.url})
    return private_redis


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


def test_the_messages_of_one_publish_reach_the_broker_together(broker, monkeypatch):
    monkeypatch.setenv("CLARION_BATCH_SIZE", "1")  # a message per key: round trips show
    settings.reset()
    client = redis.Redis.from_url(broker.url)
    publish(ROUTE, [("u0", 0, "transactional")])  # the producer's connection made, queue declared
    client.delete("transactional")
    before = _reads(client)
    sent = publish(ROUTE, [(f"u{i}", i, "transactional") for i in range(400)])
    reads = _reads(client) - before - 1  # INFO's own read
    assert sent == 400
    assert reads < sent / 4, reads  # one read per message without the batch (400 measured)
    assert sorted(ids[0] for _, ids in _queued(client, "transactional")) == list(range(400))


def test_a_publish_splits_keys_by_lane_in_batches(broker):
    client = redis.Redis.from_url(broker.url)
    rows = [(f"u{i}", i, "transactional" if i % 4 else "activation") for i in range(2000)]
    assert publish(ROUTE, rows) == 15 + 5  # 1,500 keys in messages of 100, and 500
    for lane, mine in (("transactional", lambda i: i % 4), ("activation", lambda i: not i % 4)):
        batches = _queued(client, lane)
        assert all(len(ids) == 100 and users == [f"u{i}" for i in ids] for users, ids in batches)
        assert sorted(i for _, ids in batches for i in ids) == [i for i in range(2000) if mine(i)]


def test_a_batch_the_broker_lost_is_sent_again_one_by_one(broker):
    publish(ROUTE, [("u0", 0, "transactional")])  # the producer's connection made
    broker.stop()  # the batch's flush meets a broker that is gone

    class Restart(logging.Handler):  # the broker is back when the batch is sent again
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "action", None) == "publish_batch_failed":
                self.seen = record.getMessage()
                broker.start()

    restart = Restart()
    logging.getLogger("clarion.tasks.publish").addHandler(restart)
    try:
        assert publish(ROUTE, [(f"u{i}", i, "transactional") for i in range(250)]) == 3
    finally:
        logging.getLogger("clarion.tasks.publish").removeHandler(restart)
    assert "a batch of 3 clarion.route messages failed" in restart.seen
    client = redis.Redis.from_url(broker.url)  # a new server: only what came after the restart
    assert sorted(i for _, ids in _queued(client, "transactional") for i in ids) == list(range(250))
