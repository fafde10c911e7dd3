"""`clarion stats`: what the ledger holds, what was prevented, and what is queued."""

from __future__ import annotations

from typing import cast

import kombu
import redis as redis_lib

from db import reports
from db.engine import engine
from ops.table import render

QUEUES = ("transactional", "activation", "control")


def counters(redis_url: str) -> dict[str, int]:
    # No decode_responses: keys and values come back as bytes.
    raw = cast(dict[bytes, bytes], redis_lib.Redis.from_url(redis_url).hgetall("clarion:counters"))
    return {k.decode(): int(v) for k, v in raw.items()}


def queue_depths(broker_url: str) -> list[tuple[str, int | str]]:
    """Messages waiting in each clarion queue, on any kombu broker (Redis, RabbitMQ)."""
    depths: list[tuple[str, int | str]] = []
    with kombu.Connection(broker_url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in QUEUES:
            try:
                depths.append(
                    (queue, channel.queue_declare(queue=queue, passive=True).message_count)
                )
            except conn.channel_errors:  # not declared yet: no worker has consumed it so far
                depths.append((queue, "0 (not declared yet)"))
                channel = conn.channel()
    return depths


def report(database_url: str, redis_url: str, broker_url: str) -> str:
    with engine(database_url).connect() as conn:
        parts = [
            render(["lane", "state", "requests"], reports.request_counts(conn), "Requests"),
            render(
                ["lane", "channel", "state", "deliveries"],
                reports.delivery_counts(conn),
                "Deliveries",
            ),
            render(
                ["gate", "outcome", "reason", "count"],
                reports.decision_counts(conn),
                "Not delivered, with the recorded reason",
            ),
            render(["kind", "count"], reports.incident_counts(conn), "Incidents"),
        ]
    parts.append(
        render(
            ["counter", "value"],
            sorted(counters(redis_url).items()),
            "Work found already done (duplicates prevented)",
        )
    )
    parts.append(render(["queue", "messages waiting"], queue_depths(broker_url), "Broker queues"))
    return "\n\n".join(parts)
