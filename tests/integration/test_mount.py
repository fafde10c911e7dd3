"""clarion mounted by a host app under /notify, served over real HTTP (uvicorn in a thread) on real
PostgreSQL and Redis: the host's own middleware runs on clarion's requests; the API, its 404s and
its OpenAPI document, the preferences link and page, Twilio's signed status callbacks and Slack's
signed requests all work under the prefix; nothing clarion generates points outside it."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urljoin, urlsplit

import httpx
import pytest
from fastapi import FastAPI
from openapi_spec_validator import validate
from starlette.middleware.base import BaseHTTPMiddleware

from clarion.standins.fake_slack import serving
from clarion.standins.fake_twilio import FakeTwilio, sign
from clarion.tasks import notify, preferences_link, register_recipient
from clarion.tasks.preferences import get_preferences
from clarion.tasks.route import route
from clarion.web import asgi_app
from clarion.web.api_auth import SCOPES, create_key
from tests.support.forms import Form
from tests.support.gates import use_page_catalog
from tests.support.pipeline import configure, drain, publishing_to_this_tests_broker, rows

pytestmark = pytest.mark.integration

PREFIX = "/notify"
SMS_CATALOG = Path(__file__).parents[1] / "catalog_sms.yaml"
SLACK_SECRET = "host-slack-signing-secret"


@dataclass
class Host:
    url: str  # the host app's base URL
    seen: list[str]  # paths the host's own middleware saw

    @property
    def clarion(self) -> str:
        return self.url + PREFIX


def host_app(seen: list[str]) -> FastAPI:
    """A host app: its own route, its own middleware, clarion mounted under PREFIX."""
    host = FastAPI()

    @host.get("/")
    def home() -> dict[str, str]:
        return {"app": "host"}

    class Mark(BaseHTTPMiddleware):
        async def dispatch(self, request, call_next):
            seen.append(request.url.path)
            response = await call_next(request)
            response.headers["X-Host-App"] = "yes"
            return response

    host.add_middleware(Mark)
    host.mount(PREFIX, asgi_app())
    return host


@pytest.fixture
def host(clarion_env, monkeypatch) -> Iterator[Host]:
    seen: list[str] = []
    with serving(host_app(seen)) as url, publishing_to_this_tests_broker():
        configure(monkeypatch, public_url=url + PREFIX)
        yield Host(url, seen)


def test_an_event_posted_under_the_prefix_is_accepted_through_the_hosts_middleware(host):
    register_recipient("ann", timezone="Europe/Berlin")
    key = {"Authorization": f"Bearer {create_key('host', list(SCOPES), (100, 1)).secret}"}
    body = {"event_id": "e1", "user_id": "ann", "type": "receipt", "variables": {"order": "A-1"}}
    answer = httpx.post(f"{host.clarion}/v1/events", json=body, headers=key)
    assert answer.status_code == 202, answer.text
    assert answer.headers["X-Host-App"] == "yes"
    assert f"{PREFIX}/v1/events" in host.seen
    [row] = rows("SELECT user_id, type_key, occurrence_key FROM requests")
    assert row == {"user_id": "ann", "type_key": "receipt", "occurrence_key": "event:e1"}
    # the same body again is the same request (the idempotency of the door, under the prefix)
    again = httpx.post(f"{host.clarion}/v1/events", json=body, headers=key)
    assert again.status_code == 202 and again.json()["request_id"] == answer.json()["request_id"]
    # the API's own 404 shape under the prefix; outside it, the host answers
    missing = httpx.get(f"{host.clarion}/v1/nothing-here", headers=key)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert httpx.post(f"{host.url}/v1/events", json=body, headers=key).status_code == 404
    assert httpx.get(f"{host.url}/").json() == {"app": "host"}


def test_the_openapi_document_and_docs_point_under_the_prefix(host):
    answer = httpx.get(f"{host.clarion}/openapi.json")
    assert answer.status_code == 200
    doc = answer.json()
    validate(doc)
    assert doc["servers"] == [{"url": PREFIX}]
    # every documented path, joined to the server, reaches clarion (a 401/4xx of its own, never
    # the host's 404): the document's servers + paths are the real addresses
    for path, operations in doc["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "x1", path)
        for method in operations:
            reached = httpx.request(method, f"{host.url}{PREFIX}{concrete}", content=b"")
            assert reached.status_code != 404 or reached.json().get("error"), (method, path)
            assert reached.status_code < 500, (method, path, reached.text)
    docs = httpx.get(f"{host.clarion}/docs")
    assert docs.status_code == 200 and f"'{PREFIX}/openapi.json'" in docs.text
    # Starlette's trailing-slash redirect keeps the prefix
    slash = httpx.get(f"{host.clarion}/healthz/", follow_redirects=False)
    assert slash.status_code == 307 and urlsplit(slash.headers["location"]).path == (
        f"{PREFIX}/healthz"
    )
    assert httpx.get(f"{host.clarion}/healthz").json() == {"status": "ok"}


def test_the_preferences_link_and_its_form_stay_under_the_prefix(host, monkeypatch, tmp_path):
    use_page_catalog(monkeypatch, tmp_path)  # the gate catalog with in_app, which recipients choose
    configure(monkeypatch, public_url=host.clarion)
    register_recipient("ann", timezone="Europe/Berlin", country="DE")
    link = preferences_link("ann")
    assert link.startswith(f"{host.clarion}/preferences?t=")
    page = httpx.get(link)
    assert page.status_code == 200 and page.headers["X-Host-App"] == "yes"
    form = Form(page.text)
    target = urljoin(link, form.action)  # where a browser posts the form
    assert target == link
    saved = httpx.post(
        target,
        content="&".join(f"{k}={v}" for k, v in form.submit(off={"stalled_plan/in_app"})),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert saved.status_code == 200 and "Saved. 1 setting changed." in saved.text
    assert get_preferences("ann")["settings"] == {"type:stalled_plan/in_app": False}


def test_twilio_status_callbacks_carry_the_prefix_and_verify(host, monkeypatch):
    with FakeTwilio() as fake:
        configure(
            monkeypatch,
            catalog=SMS_CATALOG,
            twilio_account_sid=FakeTwilio.ACCOUNT_SID,
            twilio_auth_token=FakeTwilio.AUTH_TOKEN,
            twilio_api_url=fake.url,
            twilio_from=FakeTwilio.NUMBER,
            public_url=host.clarion,
            sms_segments_per_second=100,
            twilio_timeout=1,
            send_timeout=3,
        )
        register_recipient("ana", timezone="Europe/Berlin", addresses={"sms": "+4915112345678"})
        request = notify("ana", "sms_receipt", event_id=uuid.uuid4().hex)
        assert route(["ana"], [request.request_id]) == 1
        drain("transactional")
        [message] = fake.messages()
        [delivery] = rows("SELECT id FROM deliveries WHERE request_id = :r", r=request.request_id)
        status_url = f"{host.clarion}/webhooks/twilio/status"
        query = urlencode({"u": "ana", "d": delivery["id"]})
        assert message.status_callback == f"{status_url}?{query}"
        # Twilio signs the URL it calls; clarion under the prefix checks that same URL
        assert fake.progress(message.sid) == [("queued", 204), ("sent", 204), ("delivered", 204)]
        [state] = rows("SELECT state FROM deliveries WHERE id = :d", d=delivery["id"])
        assert state == {"state": "delivered"}
        params = {"MessageSid": message.sid, "MessageStatus": "failed", "To": "+4915112345678"}
        unprefixed = sign(
            FakeTwilio.AUTH_TOKEN, f"{host.url}/webhooks/twilio/status?{query}", params
        )
        forged = httpx.post(
            f"{status_url}?{query}",
            content=urlencode(params),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Twilio-Signature": unprefixed,  # signed for the URL without the prefix
            },
        )
        assert forged.status_code == 401


def _slack_signed(body: bytes, secret: str, at: int) -> dict[str, str]:
    import hashlib
    import hmac

    mac = hmac.new(secret.encode(), f"v0:{at}:".encode() + body, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": str(at),
        "X-Slack-Signature": f"v0={mac}",
        "Content-Type": "application/json",
    }


def test_slack_requests_under_the_prefix_are_verified(host, monkeypatch):
    configure(
        monkeypatch,
        slack_token="xoxb-host-test",
        slack_signing_secret=SLACK_SECRET,
        public_url=host.clarion,
    )
    body = json.dumps({"type": "url_verification", "challenge": "c-42", "token": "t"}).encode()
    now = int(time.time())
    good = httpx.post(
        f"{host.clarion}/slack/events", content=body, headers=_slack_signed(body, SLACK_SECRET, now)
    )
    assert good.status_code == 200 and "c-42" in good.text
    bad = httpx.post(
        f"{host.clarion}/slack/events", content=body, headers=_slack_signed(body, "other", now)
    )
    assert bad.status_code == 401
