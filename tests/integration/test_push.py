"""Push end to end: notify → route → deliver with real PostgreSQL and Redis, the real google-auth
and httpx (HTTP/2 via h2) against the local FCM (standins/fake_fcm.py) and APNs (standins/fake_apns.py,
TLS + ALPN h2). Everything is counted at the fakes: what each device token received, and every
request that reached it, answered or not.

A recipient has two FCM devices and one APNs device; one delivery reaches all three. An invalid
token is removed and listed, and never tried again; a 429 pauses the provider for every worker and
costs no attempt; a lost answer follows the documented policy (adapters/push.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from clarion import clock
from clarion import settings as clarion_settings
from clarion.adapters.apns import DEFAULT_PAUSE as APNS_PAUSE
from clarion.adapters.apns import apns_id
from clarion.db.engine import engine
from clarion.ops.explain import explain
from clarion.records import idempotency_key
from clarion.standins.fake_apns import FakeApns
from clarion.standins.fake_fcm import FakeFcm
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.tasks.tick import tick
from tests.support.pipeline import (
    configure,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

CATALOG = Path(__file__).parents[1] / "catalog_push.yaml"
PHONE, TABLET = "fcm-phone-" + "a" * 24, "fcm-tablet-" + "b" * 24
IPHONE = "c0ffee" * 10 + "abcd"  # 64 hex digits
DEVICES = [f"fcm:{PHONE}", f"fcm:{TABLET}", f"apns:{IPHONE}"]
Key = tuple[str, int]


@dataclass
class Fakes:
    fcm: FakeFcm
    apns: FakeApns

    def received(self) -> dict[str, int]:
        """Notifications each device got (accepted by its provider)."""
        got = {f"fcm:{t}": n for t, n in self.fcm.per_token().items()}
        return got | {f"apns:{t}": n for t, n in self.apns.per_device().items()}

    def attempts(self) -> dict[str, int]:
        """Requests that reached the provider for each device, whatever the answer."""
        tried = {f"fcm:{t}": n for t, n in self.fcm.attempts.items()}
        return tried | {f"apns:{t}": n for t, n in self.apns.attempts.items()}


@pytest.fixture
def fakes(clarion_env, tmp_path, monkeypatch) -> Iterator[Fakes]:
    with FakeFcm() as fcm, FakeApns(now=lambda: clock.now().timestamp()) as apns:
        configure(
            monkeypatch,
            catalog=CATALOG,
            fcm_service_account=fcm.write_service_account(tmp_path / "service-account.json"),
            fcm_api_url=fcm.url,
            apns_key=apns.write_key(tmp_path / "AuthKey.p8"),
            apns_key_id=FakeApns.KEY_ID,
            apns_team_id=FakeApns.TEAM_ID,
            apns_topic=apns.topic,
            apns_url=apns.url,
            apns_ca_file=apns.ca_file,
            push_timeout=1,  # a late answer (2 s) is past it
            send_timeout=6,
        )
        register_recipient("ana", timezone="UTC", addresses={"push": DEVICES})  # type: ignore[dict-item]
        with publishing_to_this_tests_broker():
            yield Fakes(fcm, apns)


def _notify(user: str, type_key: str = "push_alert", event: str = "e1", **variables) -> Key | None:
    """Notify and route; the key of the push delivery, or None if the gates gave it none.

    The route sends the delivery itself, in this process (its lane has no budget): when this
    returns, the first attempt has been made and recorded. `_deliver` is for the attempts after."""
    request = notify(user, type_key, event_id=event, variables=variables)
    assert route([user], [request.request_id]) == 1
    drain("transactional"), drain("activation")
    found = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request.request_id)
    return (found[0]["user_id"], found[0]["id"]) if found else None


def _deliver(*keys: Key) -> int:
    return deliver([k[0] for k in keys], [k[1] for k in keys])


def _retry(key: Key) -> int:
    """The next attempt, once it is due (the backoff is not what is tested here)."""
    with engine().begin() as conn:
        conn.execute(text("UPDATE deliveries SET not_before = now() WHERE state = 'pending'"))
    return _deliver(key)


def _delivery(key: Key) -> dict:
    [row] = rows(
        "SELECT state, platform, attempts, provider_message_id, last_error, not_before"
        " FROM deliveries WHERE user_id = :u AND id = :i",
        u=key[0],
        i=key[1],
    )
    return row


def _devices(user: str) -> str | None:
    [row] = rows("SELECT addresses ->> 'push' AS push FROM recipients WHERE user_id = :u", u=user)
    return row["push"]


def _decisions(key: Key) -> list[dict]:
    """The decisions recorded about one delivery."""
    return rows(
        "SELECT gate, outcome, reason, detail FROM decisions WHERE delivery_id = :d ORDER BY id",
        d=key[1],
    )


def _incidents() -> list[str]:
    return [r["kind"] for r in rows("SELECT kind FROM incidents ORDER BY id")]


# --- sending ------------------------------------------------------------------------------------


def test_every_device_gets_one_notification_collapsed_by_the_occurrence(fakes):
    key = _notify("ana")
    assert key is not None and _delivery(key)["state"] == "sent"  # by the route
    assert fakes.received() == {d: 1 for d in DEVICES}
    collapse = "push_alert:event:e1"
    for token in (PHONE, TABLET):
        [message] = fakes.fcm.messages(token)
        assert message["notification"] == {"title": "Disk almost full", "body": "92% used on db-1."}
        assert message["data"] == {"clarion_delivery_id": str(key[1])}
        assert message["android"]["collapse_key"] == collapse
        assert message["android"]["notification"]["tag"] == collapse
        assert message["apns"]["headers"]["apns-collapse-id"] == collapse
    [note] = fakes.apns.for_device(IPHONE)
    assert note.headers["apns-collapse-id"] == collapse
    assert (note.headers["apns-topic"], note.headers["apns-push-type"]) == (FakeApns.TOPIC, "alert")
    assert note.headers["apns-priority"] == "10"  # an alert
    assert note.headers["apns-id"] == apns_id(
        idempotency_key("ana", "push_alert", "event:e1", "push"), IPHONE
    )
    assert note.payload["aps"]["alert"] == {
        "title": "Disk almost full",
        "body": "92% used on db-1.",
    }
    # the APNs request really was HTTP/2: ALPN h2 on TLS, parsed by h2 as an HTTP/2 stream
    assert fakes.apns.connections == ["h2"] and (note.alpn, note.stream_id) == ("h2", 1)
    row = _delivery(key)
    assert (row["state"], row["platform"], row["attempts"]) == ("sent", "push", 1)
    ids = row["provider_message_id"].split()
    assert len(ids) == 3 and ids[2] == note.apns_id
    assert all(i.startswith("projects/clarion-test/messages/") for i in ids[:2])
    assert fakes.fcm.counts.token_requests == 1  # google-auth's JWT-bearer grant, once


def test_a_types_collapse_key_is_the_collapse_id_and_the_tokens_are_reused(fakes):
    first, second = _notify("ana", "build_failed", "b42", build="42"), None
    assert first is not None and _delivery(first)["state"] == "sent"  # by the route
    second = _notify("ana", "build_failed", "b43", build="43")
    assert second is not None and _delivery(second)["state"] == "sent"
    for token in (PHONE, TABLET):
        keys = [m["android"]["collapse_key"] for m in fakes.fcm.messages(token)]
        assert keys == ["build:42", "build:43"]
        assert [m["apns"]["headers"]["apns-collapse-id"] for m in fakes.fcm.messages(token)] == keys
    assert [n.headers["apns-collapse-id"] for n in fakes.apns.for_device(IPHONE)] == [
        "build:42",
        "build:43",
    ]
    assert fakes.fcm.counts.token_requests == 1  # one OAuth2 token for both ...
    assert len(fakes.apns.counts.provider_tokens) == 1  # ... and one provider JWT
    assert fakes.apns.connections == ["h2"]  # both on one HTTP/2 connection


# --- invalid tokens -------------------------------------------------------------------------------

INVALID = {
    "fcm_unregistered": (lambda f: f.fcm.unregister(PHONE), f"fcm:{PHONE}", "UNREGISTERED"),
    "fcm_invalid_argument": (
        lambda f: f.fcm.fail("INVALID_ARGUMENT", token=TABLET),
        f"fcm:{TABLET}",
        "INVALID_ARGUMENT",
    ),
    "apns_unregistered": (lambda f: f.apns.unregister(IPHONE), f"apns:{IPHONE}", "Unregistered"),
    "apns_bad_device_token": (
        lambda f: f.apns.fail("BadDeviceToken", 400, token=IPHONE),
        f"apns:{IPHONE}",
        "BadDeviceToken",
    ),
    "apns_not_for_topic": (
        lambda f: f.apns.fail("DeviceTokenNotForTopic", 400, token=IPHONE),
        f"apns:{IPHONE}",
        "DeviceTokenNotForTopic",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_token_is_removed_recorded_and_never_tried_again(fakes, case):
    inject, gone, reason = INVALID[case]
    inject(fakes)
    key = _notify("ana")
    # the route sent it (the other devices took it): nothing is left to claim
    assert key is not None and _deliver(key) == 0
    kept = [d for d in DEVICES if d != gone]
    assert fakes.received() == {d: 1 for d in kept}
    assert _delivery(key)["state"] == "sent"
    assert _devices("ana") == " ".join(kept)  # removed from the recipient
    [listed] = rows("SELECT user_id, channel, address, reason, detail FROM suppressions")
    assert (listed["user_id"], listed["channel"], listed["address"], listed["reason"]) == (
        "ana",
        "push",
        gone,
        "invalid_token",
    )
    assert listed["detail"].startswith(f"delivery {key[1]}: {reason}")
    shown = explain("ana")  # what an operator sees
    assert "on the suppression list" in shown and "invalid_token" in shown and reason in shown

    second = _notify("ana", event="e2")
    assert second is not None and _delivery(second)["state"] == "sent"  # by the route
    assert fakes.received() == {d: 2 for d in kept}  # only the remaining devices ...
    assert fakes.attempts()[gone] == 1  # ... the invalid one was never asked again
    assert _incidents() == []


def test_when_every_device_is_invalid_the_next_notify_is_suppressed_with_its_reason(fakes):
    stale = [f"fcm:{PHONE}", f"apns:{IPHONE}"]
    register_recipient("bob", timezone="UTC", addresses={"push": stale})
    fakes.fcm.unregister(PHONE)
    fakes.apns.unregister(IPHONE)
    key = _notify("bob")
    assert key is not None and _deliver(key) == 0  # the route's send failed: nothing to claim
    assert _delivery(key)["state"] == "failed"
    [failed] = _decisions(key)
    assert (failed["gate"], failed["outcome"], failed["reason"]) == (
        "deliver",
        "failed",
        "no_valid_device",
    )
    assert "UNREGISTERED" in failed["detail"] and "Unregistered" in failed["detail"]
    assert sorted(
        (r["address"], r["reason"]) for r in rows("SELECT address, reason FROM suppressions")
    ) == sorted((d, "invalid_token") for d in stale)
    assert _devices("bob") is None  # no device left

    assert _notify("bob", event="e2") is None  # stopped at the gates, with the reason
    [request] = rows("SELECT id FROM requests WHERE occurrence_key = 'event:e2'")
    assert rows(
        "SELECT gate, reason FROM decisions WHERE request_id = :r AND channel = 'push'",
        r=request["id"],
    ) == [{"gate": "channel", "reason": "no_address"}]
    shown = explain("bob")
    assert "no_valid_device" in shown and "no_address" in shown

    # the app registers the same stale tokens again: the suppression list stops them
    register_recipient("bob", timezone="UTC", addresses={"push": stale})
    assert _notify("bob", event="e3") is None
    [stopped] = rows(
        "SELECT d.gate, d.reason, d.detail FROM decisions d JOIN requests r ON r.id = d.request_id"
        " WHERE r.occurrence_key = 'event:e3' AND d.channel = 'push'"
    )
    assert (stopped["gate"], stopped["reason"]) == ("suppression", "suppressed_address")
    assert "invalid_token" in stopped["detail"]
    assert fakes.attempts() == {d: 1 for d in stale}  # each asked once, ever
    assert fakes.received() == {}


# --- rate limits ------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["fcm", "apns"])
def test_a_429_pauses_the_provider_and_recovers_with_the_attempt_refunded(fakes, provider):
    devices = [f"fcm:{PHONE}", f"fcm:{TABLET}"] if provider == "fcm" else [f"apns:{IPHONE}"]
    register_recipient("cam", timezone="UTC", addresses={"push": devices})
    if provider == "fcm":
        fakes.fcm.fail("QUOTA_EXCEEDED", retry_after=30)
        wait, reason = 30.0, "QUOTA_EXCEEDED"
    else:
        fakes.apns.fail("TooManyRequests", 429)
        wait, reason = APNS_PAUSE, "TooManyRequests"
    with frozen_clock() as clk:
        start = clk.now
        first, second = _notify("cam"), _notify("cam", event="e2")
        assert first is not None and second is not None
        assert _deliver(first) == 0  # the route's send met the 429; not due again yet
        row = _delivery(first)
        assert (row["state"], row["attempts"]) == ("pending", 0)  # a rate limit is no attempt
        assert row["last_error"].startswith(reason)
        assert wait <= (row["not_before"] - start).total_seconds() <= wait + 6.01  # + jitter
        assert fakes.attempts() == {devices[0]: 1}  # after the 429, the other device waits too
        assert redis.Redis.from_url(clarion_settings.get().urls()[1]).keys(
            f"clarion:rl:{{{provider}:*:pause"
        )

        # its route found the provider paused for every worker: not even tried
        assert _deliver(second) == 0
        assert fakes.attempts() == {devices[0]: 1}
        assert _delivery(second)["last_error"].startswith("paused")

        clk.advance(wait - 1)
        assert tick()["deliveries"] == 0
        clk.advance(8)
        assert tick()["deliveries"] == 2
        drain("transactional")
        assert _deliver(first, second) == 2
    assert fakes.received() == {d: 2 for d in devices}  # each delivery once on each device
    assert [_delivery(k)["attempts"] for k in (first, second)] == [1, 1]
    assert _incidents() == []


# --- the third outcome --------------------------------------------------------------------------------

LOSSES = ("drop", "late", "5xx")


def _lose(fakes: Fakes, provider: str, loss: str) -> None:
    if provider == "fcm":
        fakes.fcm.losses.next(loss, match="messages:send")
    else:
        fakes.apns.losses.next(loss)


def _same_collapse_id(fakes: Fakes, provider: str) -> None:
    """The repeat carries the first's collapse id (and on APNs its apns-id): it replaces."""
    if provider == "apns":
        first, again = fakes.apns.for_device(IPHONE)
        assert first.apns_id == again.apns_id
        assert first.headers["apns-collapse-id"] == again.headers["apns-collapse-id"]
        return
    first_m, again_m = fakes.fcm.messages(PHONE)
    assert first_m["android"]["collapse_key"] == again_m["android"]["collapse_key"]
    assert first_m["android"]["notification"]["tag"] == again_m["android"]["notification"]["tag"]
    assert (
        first_m["apns"]["headers"]["apns-collapse-id"]
        == (again_m["apns"]["headers"]["apns-collapse-id"])
    )
    assert fakes.fcm.shown(PHONE) == [again_m]  # one notification on the device, not two


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("provider", ["fcm", "apns"])
def test_an_at_most_once_push_whose_answer_is_lost_is_resent_under_its_collapse_id(
    fakes, provider, loss
):
    device = f"fcm:{PHONE}" if provider == "fcm" else f"apns:{IPHONE}"
    register_recipient("dee", timezone="UTC", addresses={"push": [device]})
    _lose(fakes, provider, loss)
    key = _notify("dee", "push_nudge")
    assert key is not None and _deliver(key) == 0  # the route's send lost its answer
    assert _delivery(key)["state"] == "pending"  # not held: the resend replaces on the device
    assert _retry(key) == 1
    assert _delivery(key)["state"] == "sent"
    assert fakes.received() == {device: 2} and fakes.attempts() == {device: 2}
    _same_collapse_id(fakes, provider)
    assert _incidents() == ["possible_duplicate"]  # the provider had it twice: said so
    assert _devices("dee") == device  # a lost answer says nothing about the token


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("provider", ["fcm", "apns"])
def test_an_at_least_once_push_whose_answer_is_lost_is_sent_again_and_replaces(
    fakes, provider, loss
):
    device = f"fcm:{PHONE}" if provider == "fcm" else f"apns:{IPHONE}"
    register_recipient("dee", timezone="UTC", addresses={"push": [device]})
    _lose(fakes, provider, loss)
    key = _notify("dee", "push_alert")
    assert key is not None and _deliver(key) == 0  # the route's send lost its answer
    assert _delivery(key)["state"] == "pending"  # may have sent: owed, with the same ids
    assert _retry(key) == 1
    assert fakes.received() == {device: 2}  # the provider cannot dedup: a possible duplicate ...
    assert _delivery(key)["state"] == "sent"
    assert _incidents() == ["possible_duplicate"]  # ... that the operator is told about
    _same_collapse_id(fakes, provider)  # ... which replaces the first on the device


def test_a_lost_answer_on_one_device_while_the_others_took_it_is_sent(fakes):
    fakes.apns.losses.next("drop")
    key = _notify("ana", "push_nudge")
    assert key is not None and _deliver(key) == 0  # the route sent it: nothing left to claim
    assert _delivery(key)["state"] == "sent"
    assert fakes.received() == {d: 1 for d in DEVICES}  # the APNs one too, though unanswered
    assert _retry(key) == 0 and fakes.attempts() == {d: 1 for d in DEVICES}
    assert _incidents() == [] and _devices("ana") == " ".join(DEVICES)


def test_an_unregistered_token_of_one_user_is_never_pushed_for_another(fakes):
    fakes.fcm.unregister(PHONE)
    key = _notify("ana")  # ana's phone is UNREGISTERED: recorded for ana
    assert key is not None and fakes.attempts()[f"fcm:{PHONE}"] == 1
    for user in ("bob", "cy"):  # the same (dead) token registered for others: allowed…
        register_recipient(user, timezone="UTC", addresses={"push": [f"fcm:{PHONE}"]})
        assert _notify(user) is None  # …but nothing is pushed, with the reason
        [stopped] = rows(
            "SELECT gate, reason, detail FROM decisions WHERE user_id = :u AND channel = 'push'",
            u=user,
        )
        assert (stopped["gate"], stopped["reason"]) == ("suppression", "suppressed_address")
        assert "invalid_token recorded for another recipient with this address" in stopped["detail"]
        assert "invalid_token recorded for another recipient" in explain(user)
    assert fakes.attempts()[f"fcm:{PHONE}"] == 1  # no further push to the dead token
