"""The query module behind `clarion explain`, `GET /v1/requests/{id}` and the activity page
(db/activity.py), on real PostgreSQL and Redis, over four stories made through the real pipeline
(tests/support/activity.py): the records, the search (by user, request id, event id, address —
an erased recipient's suppressed address through its keyed hash), the time-ordered steps with
their reasons in words, and the API's answer built from the very same records."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

import pytest
from starlette.testclient import TestClient

from clarion import settings
from clarion.db import activity
from clarion.db.engine import engine
from clarion.ops.explain import explain
from clarion.tasks import recipients
from clarion.web.activity_view import timeline
from clarion.web.api_auth import create_key
from clarion.web.app import create_app
from tests.support.activity import BOUNCE, HOOK, MONDAY, Stories, four_stories

pytestmark = pytest.mark.integration


@pytest.fixture
def stories(clarion_env, monkeypatch) -> Iterator[Stories]:
    with four_stories(settings.get().webhook_secret, monkeypatch) as made:
        yield made


def history(request_id: int) -> activity.RequestHistory:
    with engine().connect() as conn:
        found = activity.request(conn, "ann", request_id)
    assert found is not None
    return found


def found(**search) -> list[tuple[str, tuple[int, ...]]]:
    with engine().connect() as conn:
        return [(m.user_id, m.request_ids) for m in activity.find_users(conn, **search)]


def test_the_records_tell_each_story(stories):
    bounced = history(stories.bounced)
    [sent] = bounced.deliveries
    assert (sent.channel, sent.state, sent.attempts) == ("webhook", "bounced", 1)
    assert [(r.event, r.outcome, r.detail) for r in bounced.receipts] == [
        ("bounced", "applied", BOUNCE)
    ]
    assert bounced.event_id == "order-1"

    suppressed = history(stories.suppressed)
    assert suppressed.deliveries == []
    assert ("suppression", "suppress", "suppressed_address") in [
        (d.gate, d.outcome, d.reason) for d in suppressed.decisions
    ]

    deferred = history(stories.deferred)
    assert deferred.state == "deferred" and deferred.due_at is not None
    assert deferred.due_at > MONDAY  # 07:00 in New York

    unknown = history(stories.unknown)
    [held] = unknown.deliveries
    assert held.state == "unknown" and held.maybe_sent_at is not None
    assert [i.kind for i in unknown.incidents] == ["outcome_unknown"]


def test_the_steps_are_in_time_order_with_reasons_in_words(stories):
    steps = timeline(history(stories.bounced), MONDAY)
    assert [s.at for s in steps] == sorted(s.at for s in steps)
    assert steps[0].stage == "request" and "order-1" in steps[0].words
    stages = [s.stage for s in steps]
    assert stages.index("delivery") < stages.index("receipt")
    [bounce] = [s for s in steps if s.stage == "receipt"]
    assert "bounced" in bounce.words and "suppression list" in bounce.words
    assert bounce.detail == BOUNCE

    words = " ".join(s.words for s in timeline(history(stories.deferred), MONDAY))
    assert "quiet hours" in words
    words = " ".join(s.words for s in timeline(history(stories.suppressed), MONDAY))
    assert "on the suppression list" in words
    words = " ".join(s.words for s in timeline(history(stories.unknown), MONDAY))
    assert "Held as unknown and not sent again" in words


def test_search_by_user_request_event_and_address(stories):
    assert found(user_id="ann") == [("ann", ())]
    assert found(request_id=stories.unknown) == [("ann", (stories.unknown,))]
    assert found(request_id=stories.unknown, user_id="bob") == []
    assert found(event_id="tip-1") == [("ann", (stories.deferred,))]
    assert found(address=HOOK) == [("ann", ())]
    assert found(address="https://hooks.example/nobody") == []
    assert found(user_id="nobody") == []

    recipients.forget("ann")  # the address is gone from the recipient; its hash stays listed
    with engine().connect() as conn:
        [entry] = activity.suppressions(conn, "ann")
    assert entry.address.startswith("hmac:") and HOOK not in entry.address
    assert found(address=HOOK) == [("ann", ())]


def test_explain_reads_the_same_records(stories):
    told = explain("ann")
    with engine().connect() as conn:
        listed = activity.requests_of(conn, "ann", type_key=None, since=MONDAY, limit=20)
    assert {h.id for h in listed} == {
        stories.bounced,
        stories.suppressed,
        stories.deferred,
        stories.unknown,
    }
    for h in listed:
        assert f"request {h.id}  {h.type_key}  ({h.occurrence_key})" in told
    assert "sent on webhook (bounced)" in told and BOUNCE in told
    assert "not sent: suppressed_address" in told or "suppressed_address" in told
    assert "deferred until" in told and "outcome_unknown" in told


def test_the_api_answers_the_same_records_and_steps(stories):
    key = create_key("app", ["requests:read"]).secret
    with TestClient(create_app()) as client:
        answer = client.get(
            f"/v1/requests/{stories.unknown}",
            params={"user_id": "ann"},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert answer.status_code == 200
    got = answer.json()
    held = history(stories.unknown)
    assert got["event_id"] == "nudge-1" and got["type"] == "nudge_teams"
    assert [d["reason"] for d in got["decisions"]] == [d.reason for d in held.decisions]
    assert [i["kind"] for i in got["incidents"]] == ["outcome_unknown"]
    assert got["deliveries"][0]["state"] == "unknown"
    assert got["deliveries"][0]["maybe_sent_at"] is not None
    steps = timeline(held, MONDAY)
    assert [(s["stage"], s["reason"], s["words"]) for s in got["timeline"]] == [
        (s.stage, s.reason, s.words) for s in steps
    ]
    assert all(set(s) == set(asdict(steps[0])) for s in got["timeline"])


def test_bad_search_fields_are_refused_naming_the_field(clarion_env):
    from clarion.errors import InvalidRequest
    from clarion.web.activity import staff_token

    headers = {"Authorization": f"Bearer {create_key('support', ['activity:read']).secret}"}
    with TestClient(create_app()) as client:
        for query, field in (("tz=Mars/Olympus", "tz:"), ("request=12x", "request:")):
            answer = client.get(f"/activity?user=ann&{query}", headers=headers)
            assert answer.status_code == 400 and field in answer.text, query
        fine = client.get("/activity", headers=headers)
        assert fine.status_code == 200 and "Recipient" not in fine.text
        assert "script-src" not in fine.headers["content-security-policy"]
        assert fine.headers["referrer-policy"] == "no-referrer"
    with pytest.raises(InvalidRequest, match=r"^ttl: a staff link lives at most 24h"):
        staff_token("sam", ttl="2d")
