"""schemathesis against the app's own /openapi.json: every operation of the HTTP API is called with
generated requests (valid ones and ones that break the schema) through the real ASGI app, real
PostgreSQL and Redis and a real API key holding every scope.

Five checks per answer: no 5xx; its status is one the document declares for that operation; its
Content-Type is the declared one; its body matches the declared schema (the Error shape for every
refusal); a request that breaks the schema is refused (4xx). Deterministic and bounded:
derandomize=True, max_examples per operation and phase (~700 requests, ~20 s).

The documented examples exist (recipient `user-42`, its request 1, inbox items 1 to 3), so the
examples phase also reaches the 202 and 200 answers and checks their bodies, not only refusals. The
inbox doors take user-42's inbox token, the rest the API key. The inbox stream does not end, so it
is left out of the generated run; its refusals are checked on their own."""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from clarion import clock
from clarion.db import inbox
from clarion.db.engine import engine
from clarion.tasks import notify, register_recipient
from clarion.tasks.inbox import inbox_token
from clarion.web.api_auth import SCOPES, create_key
from clarion.web.app import create_app
from tests.support.api import _broker

pytestmark = pytest.mark.integration
__all__ = ["_broker"]  # a fixture, from tests/support/api.py

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


# The document as the app serves it, loaded through the app itself. The app reads its settings,
# database and Redis per request, so one app serves every test's fresh database.
# (schemathesis.pytest.from_fixture would load it per test, but fails on pytest 9.)
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app())
STREAM = "/v1/inbox/{user_id}/stream"


@pytest.fixture
def key(clarion_env) -> dict[str, str]:
    """A live key with every scope and a rate no generated run reaches; the documented example
    recipient registered, with three items in its inbox."""
    register_recipient("user-42", timezone="Europe/Berlin", country="de")
    made = notify("user-42", "receipt", event_id="seed", variables={"order": "A-1"})
    assert made.request_id == 1  # the documented example request_id
    with engine().begin() as conn:
        for n in (1, 2, 3):
            inbox.insert_item(
                conn,
                user_id="user-42",
                delivery_id=n,
                type_key="receipt",
                title=f"Receipt {n}",
                body="Thanks.",
                data={"n": n},
                collapse_key=None,
                now=clock.now(),
            )
    return {"Authorization": f"Bearer {create_key('schemathesis', SCOPES, (10**6, 1)).secret}"}


@pytest.fixture
def inbox_key(clarion_env) -> dict[str, str]:
    return {"Authorization": f"Bearer {inbox_token('user-42')}"}


@schema.exclude(path=STREAM).parametrize()
@settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_is_declared_and_none_is_a_5xx(case, key, inbox_key):
    headers = inbox_key if case.path.startswith("/v1/inbox/") else key
    case.call_and_validate(headers=headers, checks=CHECKS)


REFUSED_STREAMS = {  # (whose token, query, the refusal)
    "no token": (None, {}, 401),
    "another user's token": ("user-7", {}, 401),
    "a bad Last-Event-ID": ("user-42", {"last_event_id": "1.x"}, 400),
}


@pytest.mark.parametrize(
    "user, query, status", REFUSED_STREAMS.values(), ids=REFUSED_STREAMS.keys()
)
def test_the_streams_refusals_are_declared(key, user, query, status):
    case = schema[STREAM]["GET"].Case(path_parameters={"user_id": "user-42"}, query=query)
    answer = case.call(headers={"Authorization": f"Bearer {inbox_token(user)}"} if user else {})
    assert answer.status_code == status
    case.validate_response(answer, checks=CHECKS)


REFUSAL = {"error": "boom", "field": None, "reason": "x"}
BROKEN = {
    "a 5xx": (500, REFUSAL, "application/json", ["ServerError", "UndefinedStatusCode"]),
    "an undeclared status": (409, REFUSAL, "application/json", ["UndefinedStatusCode"]),
    "not the Error shape": (422, {"detail": []}, "application/json", ["JsonSchemaError"]),
    "not JSON": (401, "Unauthorized", "text/plain", ["UndefinedContentType"]),
}


@pytest.mark.parametrize("status, body, media, found", BROKEN.values(), ids=BROKEN.keys())
def test_the_checks_refuse_an_answer_the_document_does_not_declare(status, body, media, found):
    """The run above cannot pass by checking nothing: the same checks fail on a broken answer to
    POST /v1/events (a stand-in app: this tests the checks, not clarion)."""
    case = schema["/v1/events"]["POST"].Case(body={"event_id": "e1", "user_id": "u", "type": "t"})
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    broken = Starlette(
        routes=[
            Route(
                "/v1/events",
                lambda request: Response(content, status_code=status, media_type=media),
                methods=["POST"],
            )
        ]
    )
    with TestClient(broken) as http:
        answer = http.post("/v1/events", json=case.body)
    with pytest.raises(
        FailureGroup, match=r"^Schemathesis found \d+ distinct failures?\n"
    ) as failed:
        case.validate_response(answer, checks=CHECKS)
    assert sorted(type(f).__name__ for f in failed.value.exceptions) == found


def test_the_request_read_is_documented_and_each_story_matches_it(clarion_env, monkeypatch):
    """GET /v1/requests/{id} answers decisions, deliveries, receipts, incidents, outbound events
    and the activity page's timeline (docs/operations/activity.md); the document names them, and
    a bounced, a suppressed, a deferred and a held-unknown request each answer what it declares."""
    from clarion import settings as clarion_settings
    from tests.support.activity import four_stories

    document = schema.raw_schema["components"]["schemas"]
    report = document["RequestReport"]["properties"]
    assert {"decisions", "deliveries", "receipts", "incidents", "events", "timeline"} <= set(report)
    assert set(document["Step"]["properties"]) == {
        "at",
        "stage",
        "channel",
        "what",
        "reason",
        "words",
        "detail",
    }
    with four_stories(clarion_settings.get().webhook_secret, monkeypatch) as stories:
        headers = {"Authorization": f"Bearer {create_key('reader', ['requests:read']).secret}"}
        operation = schema["/v1/requests/{request_id}"]["GET"]
        for request_id in (stories.bounced, stories.suppressed, stories.deferred, stories.unknown):
            case = operation.Case(
                path_parameters={"request_id": request_id}, query={"user_id": "ann"}
            )
            answer = case.call(headers=headers)
            assert answer.status_code == 200
            case.validate_response(answer, checks=CHECKS)
            assert answer.json()["timeline"][0]["stage"] == "request"
