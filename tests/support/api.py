"""The HTTP API's test door, shared by tests/integration/test_api*.py: the fixtures (`_broker`
publishes to this test's broker for every test of a module that imports it, `ann` a recipient,
`client` a TestClient on the real app), API keys with scopes, event bodies and the refusal shape.

A module that uses the fixtures imports them and lists them in `__all__`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from clarion.tasks import register_recipient
from clarion.web.api_auth import SCOPES, create_key
from clarion.web.app import create_app
from tests.support.pipeline import count, counts, published, publishing_to_this_tests_broker

ALL = list(SCOPES)


@pytest.fixture(autouse=True)
def _broker(clarion_env) -> Iterator[None]:
    with publishing_to_this_tests_broker():
        yield


@pytest.fixture
def ann(clarion_env) -> str:
    register_recipient("ann", timezone="Europe/Berlin", country="de")
    return "ann"


@pytest.fixture
def client(clarion_env) -> Iterator[TestClient]:
    with TestClient(create_app()) as c:
        yield c


def bearer(*scopes: str, rate: tuple[int, int] = (10_000, 1)) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_key('test', scopes or ALL, rate).secret}"}


def event(**changes: Any) -> dict[str, Any]:
    body = {"event_id": "e1", "user_id": "ann", "type": "receipt", "variables": {"order": "A-1"}}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


def as_json(body: Any) -> dict[str, Any]:
    """TestClient arguments for a JSON body as a JSON encoder writes it (lone surrogates escaped)."""
    return {"content": json.dumps(body), "headers": {"Content-Type": "application/json"}}


def nested(depth: int) -> list:
    value: list = ["deep"]
    for _ in range(depth - 1):
        value = [value]
    return value


def written() -> dict[str, int]:
    """Everything an ingest call could write."""
    return {**counts(), "api_idempotency": count("api_idempotency")}


def nothing_published() -> bool:
    return all(not published(lane) for lane in ("transactional", "activation"))


def refused(response, status: int, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"error", "field", "reason"} and body["field"] == field, body
    return body
