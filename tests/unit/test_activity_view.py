"""The activity page's words and order (web/activity_view.py) and its staff links
(web/activity.py), without services: steps in the order things happened at one instant, every
reason in words (a code without words of its own as words, never blank), both time zones, the
verdict, and a staff link that no preferences link can stand in for (nor the other way round)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clarion import clock, settings
from clarion.db.activity import Decision, Delivery, Incident, Receipt, RequestHistory
from clarion.errors import InvalidRequest
from clarion.links import BadLink, ExpiredLink
from clarion.tasks import links as preference_links
from clarion.web import activity
from clarion.web import activity_view as view

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def held(**changes) -> RequestHistory:
    """A Teams nudge whose answer was lost, everything at one instant (as on a frozen clock)."""
    delivery = Delivery(
        id=7,
        channel="teams",
        state="unknown",
        attempts=1,
        sent_at=None,
        platform=None,
        last_error="no_answer: dropped",
        not_before=None,
        next_attempt_at=None,
        created_at=NOW,
        send_started_at=NOW,
        maybe_sent_at=NOW,
    )
    values = {
        "id": 4,
        "user_id": "ann",
        "type_key": "nudge_teams",
        "occurrence_key": "event:nudge-1",
        "state": "routed",
        "created_at": NOW,
        "routed_at": NOW,
        "due_at": None,
        "decisions": [
            Decision(NOW, "deliver", "unknown", "no_answer", "teams", "dropped"),
            Decision(NOW, "quiet_hours", "allow", "bypass", None, ""),
        ],
        "deliveries": [delivery],
        "receipts": [],
        "incidents": [Incident(7, "teams", "outcome_unknown", "held", NOW)],
        "events": [],
    }
    return RequestHistory(**{**values, **changes})


def test_at_one_instant_the_steps_follow_what_happened() -> None:
    steps = view.timeline(held(), NOW)
    assert [(s.stage, s.reason) for s in steps] == [
        ("request", "requested"),
        ("decision", "bypass"),  # the gates first ...
        ("delivery", "queued"),  # ... then the delivery is made and tried ...
        ("delivery", "attempt"),
        ("decision", "no_answer"),  # ... and its send decided on
        ("incident", "outcome_unknown"),
    ]
    assert all(s.words for s in steps)
    assert "Held as unknown and not sent again" in steps[4].words


def test_later_steps_sort_after_earlier_ones_whatever_their_stage() -> None:
    later = NOW + timedelta(hours=2)
    bounce = Receipt(7, NOW + timedelta(minutes=1), NOW, "teams", "bounced", "applied", "550")
    history = held(
        created_at=NOW - timedelta(seconds=1),
        receipts=[bounce],
        decisions=[Decision(later, "deliver", "unknown", "http_500", "teams", "")],
    )
    steps = view.timeline(history, NOW)
    assert [s.at for s in steps] == sorted(s.at for s in steps)
    assert steps[-1].reason == "http_500" and steps[-1].words == "Http 500."


def test_a_reason_without_words_of_its_own_is_still_words() -> None:
    assert view.words("opted_out") == "The recipient turned this kind of notification off."
    assert view.words("some_new_reason") == "Some new reason."


def test_times_in_both_zones_and_a_bad_zone_is_none() -> None:
    berlin, new_york = view.zone("Europe/Berlin"), view.zone("America/New_York")
    assert berlin is not None and new_york is not None
    assert view.local(NOW, new_york) == "2026-12-07 04:00:00 EST"
    assert view.local(NOW, berlin) == "2026-12-07 10:00:00 CET"
    assert view.zone("Mars/Olympus") is None and view.zone("../etc/passwd") is None
    assert view.zone("") is None


def test_the_verdict_of_a_held_delivery_says_it_is_held() -> None:
    assert view.verdict(held(), NOW) == (
        "outcome unknown on teams: may have arrived; held, not sent again"
    )
    deferred = held(state="deferred", due_at=NOW + timedelta(hours=3), deliveries=[])
    assert view.verdict(deferred, NOW) == "deferred until 2026-12-07 12:00:00 UTC (in 3h 0m)"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch):
    for name in ("CLARION_DATABASE_URL", "CLARION_LINK_SECRET", "CLARION_WEBHOOK_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLARION_PUBLIC_URL", "https://clarion.example")
    settings.reset()
    clock.set_source(lambda: NOW)
    yield monkeypatch
    clock.set_source(None)
    settings.reset()


def test_a_staff_link_names_its_staff_and_expires(env) -> None:
    link = activity.staff_link("sam", ttl="1h")
    assert link.startswith("https://clarion.example/activity?s=")
    token = link.partition("?s=")[2]
    assert activity.read_staff_token(token) == "sam"
    with pytest.raises(ExpiredLink, match=r"^the link expired at 2026-12-07T10:00:00"):
        activity.read_staff_token(token, now=NOW + timedelta(hours=1))
    with pytest.raises(InvalidRequest, match=r"^ttl: a staff link lives at most 24h"):
        activity.staff_token("sam", ttl="25h")


def test_a_preferences_link_is_no_staff_link_and_a_staff_link_no_preferences_link(env) -> None:
    preferences = preference_links.preferences_token("ann", ttl="1h")
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        activity.read_staff_token(preferences)
    staff = activity.staff_token("ann", ttl="1h")
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        preference_links.read_preferences_token(staff)
