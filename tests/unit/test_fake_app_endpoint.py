"""The stand-in app endpoint (standins/fake_app_endpoint.py) and the Standard Webhooks signing
(adapters/standard_webhooks.py), checked against the specification's reference library: the
stand-in accepts what that library signs and refuses what it would, and its scripted misbehaviour
(500, timeout, drop) reaches a real HTTP client as the sender sees it, then it recovers."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks

from clarion.adapters import http1
from clarion.adapters import standard_webhooks as sw
from clarion.errors import InvalidRequest
from clarion.standins.fake_app_endpoint import FakeAppEndpoint

BODY = b'{"type":"delivery.sent","timestamp":"2026-12-04T10:00:00+00:00","data":{"id":"evt_1"}}'


def test_signature_matches_the_reference_library():
    secret = sw.new_secret()
    now = int(time.time())
    ours = sw.signature(secret, "evt_1", now, BODY)
    theirs = standardwebhooks.Webhook(secret).sign(
        "evt_1", datetime.fromtimestamp(now, UTC), BODY.decode()
    )
    assert ours == theirs


def test_the_reference_library_verifies_both_signatures_of_a_rotation():
    old, new = sw.new_secret(), sw.new_secret()
    request = sw.to_request("http://x/", "evt_9", BODY, (new, old), int(time.time()))
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        assert (
            standardwebhooks.Webhook(secret).verify(BODY, request.headers)["data"]["id"] == "evt_1"
        )
    with pytest.raises(standardwebhooks.WebhookVerificationError, match="No matching signature"):
        standardwebhooks.Webhook(sw.new_secret()).verify(BODY, request.headers)


def test_verify_refuses_a_stale_timestamp_and_a_changed_body():
    secret = sw.new_secret()
    now = int(time.time())
    headers = sw.to_request("http://x/", "evt_1", BODY, (secret,), now).headers
    assert sw.verify([secret], headers, BODY, now=now)
    assert not sw.verify([secret], headers, BODY + b" ", now=now)
    assert not sw.verify([secret], headers, BODY, now=now + 301)


@pytest.mark.parametrize("bad", ["whsec_", "whsec_!!!", "abc", "whsec_" + "QUFB"])
def test_a_malformed_secret_is_refused(bad):
    with pytest.raises(InvalidRequest, match="whsec_"):
        sw.key_of(bad)


def _post(url: str, secret: str, msg_id: str, timeout: float = 0.5) -> str | None:
    request = sw.to_request(url, msg_id, BODY, (secret,), int(time.time()))
    return sw.call(http1.Connections(), request, timeout)


def test_the_stand_in_misbehaves_as_scripted_then_recovers():
    secret = sw.new_secret()
    with FakeAppEndpoint([secret], hold=1.0) as app:
        app.state.script("500")
        app.state.script("timeout")
        app.state.script("drop")
        answers = [_post(app.url, secret, f"evt_{n}") for n in range(4)]
        arrivals = app.state.snapshot()
    assert answers[0] is not None and answers[0].startswith("http_500")
    assert answers[1] is not None and answers[1].startswith("no_answer")  # the client gave up
    assert answers[2] is not None and answers[2].startswith("no_answer")  # taken, no answer
    assert answers[3] is None
    assert [a.answer for a in arrivals] == ["500", "timeout", "drop", "204"]
    assert [a.taken for a in arrivals] == [False, False, True, True]
    assert all(a.matched == (0,) for a in arrivals)
    assert json.loads(arrivals[3].body)["data"]["id"] == "evt_1"


def test_the_stand_in_refuses_a_bad_signature_and_counts_it():
    with FakeAppEndpoint([sw.new_secret()]) as app:
        answer = _post(app.url, sw.new_secret(), "evt_1")
        arrivals = app.state.snapshot()
    assert answer is not None and answer.startswith("http_401")
    assert [(a.answer, a.matched, a.taken) for a in arrivals] == [("401", (), False)]
    assert app.state.counts() == {"evt_1": 1}


def test_an_unknown_mode_is_refused():
    with FakeAppEndpoint([]) as app, pytest.raises(ValueError, match="mode must be one of"):
        app.state.script("slow")
