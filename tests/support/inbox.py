"""In-app test steps shared by tests/integration/test_inbox*.py and test_inapp_outcomes.py:
notify + route a request (its deliveries sent in this process), the user's inbox items and a
delivery's state."""

from __future__ import annotations

from clarion.tasks import notify
from clarion.tasks.route import route
from tests.support.pipeline import drain, rows


def routed(user: str, type_key: str, event: str, **variables: str) -> list[tuple[str, int]]:
    """notify + route (which sends the deliveries it routed, in this process); the request's
    deliveries (user, id), in channel order."""
    request = notify(user, type_key, event_id=event, variables=variables)
    route([user], [request.request_id])
    return deliveries_of(user, request.request_id)


def deliveries_of(user: str, request_id: int) -> list[tuple[str, int]]:
    drain("transactional")
    return [
        (r["user_id"], r["id"])
        for r in rows(
            "SELECT user_id, id FROM deliveries WHERE user_id = :u AND request_id = :r "
            "ORDER BY channel",
            u=user,
            r=request_id,
        )
    ]


def send(user: str, type_key: str, event: str, **variables: str) -> list[tuple[str, int]]:
    """notify + route, and every delivery the request has was sent by that route."""
    keys = routed(user, type_key, event, **variables)
    assert keys and [delivery(k)["state"] for k in keys] == ["sent"] * len(keys)
    return keys


def items(user: str = "ana") -> list[dict]:
    return rows(
        "SELECT id, delivery_id, title, count, read_at, seen_at, archived_at FROM inbox_items "
        "WHERE user_id = :u ORDER BY id",
        u=user,
    )


def delivery(key: tuple[str, int]) -> dict:
    [row] = rows(
        "SELECT state, platform, provider_message_id FROM deliveries WHERE user_id = :u AND id = :d",
        u=key[0],
        d=key[1],
    )
    return row
