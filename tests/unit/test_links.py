"""Signed preferences links (clarion/links.py, tasks/links.py) and the page's form reading
(web/preferences_view.py), without services: tampering, expiry on the injected clock, another
user's token, the CSRF token, the key and its settings, ttl parsing."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta

import pytest

from clarion import clock, links, settings
from clarion.catalog import Catalog
from clarion.errors import ConfigurationError, InvalidRequest
from clarion.links import BadLink, ExpiredLink
from clarion.settings import Settings, from_env
from clarion.tasks import links as preference_links
from clarion.web import preferences_view as view
from tests.support.gates import page_catalog

KEY = b"k" * 32
NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
EXPIRES = int(NOW.timestamp()) + 3600


def token(user: str = "ann", expires: int = EXPIRES, key: bytes = KEY) -> str:
    return links.sign(key, "preferences", user, expires)


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


@pytest.mark.parametrize("user", ["ann", "user-42@example.com", "ünï 💬", "a\x1fb", "x" * 256])
def test_a_token_names_its_user_until_it_expires(user: str) -> None:
    assert links.verify(KEY, "preferences", token(user), now=NOW) == user


def test_every_one_character_change_is_refused() -> None:
    good = token()
    alphabet = "AZaz09-_."
    for i, ch in enumerate(good):
        for other in alphabet:
            if other == ch:
                continue
            bad = good[:i] + other + good[i + 1 :]
            with pytest.raises(
                BadLink, match=r"^(malformed link token|the link's signature does not verify)$"
            ):
                links.verify(KEY, "preferences", bad, now=NOW)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "abc",
        "a.b.c",
        token()[:-1],
        token()[:-5],
        token().split(".")[0],
        token() + ".x",
        token() + "=",
        " " + token(),
        token().replace(".", ".\x00"),
        "é." + token().split(".")[1],
        "A" * 5000,
    ],
)
def test_malformed_tokens_are_refused(bad: str) -> None:
    with pytest.raises(
        BadLink, match=r"^(malformed link token|the link's signature does not verify)$"
    ):
        links.verify(KEY, "preferences", bad, now=NOW)


def test_not_a_string_is_refused() -> None:
    with pytest.raises(BadLink, match=r"^malformed link token$"):
        links.verify(KEY, "preferences", None, now=NOW)  # type: ignore[arg-type]


def test_another_users_payload_under_this_signature_is_refused() -> None:
    ann, bob = token("ann"), token("bob")
    swapped = f"{bob.split('.')[0]}.{ann.split('.')[1]}"
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        links.verify(KEY, "preferences", swapped, now=NOW)
    forged = f"{b64(f'bob{chr(31)}{EXPIRES}')}.{ann.split('.')[1]}"
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        links.verify(KEY, "preferences", forged, now=NOW)
    assert links.verify(KEY, "preferences", ann, now=NOW) == "ann"


def test_a_longer_life_cannot_be_written_in() -> None:
    mac = token().split(".")[1]
    later = f"{b64(f'ann{chr(31)}{EXPIRES + 86400 * 365}')}.{mac}"
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        links.verify(KEY, "preferences", later, now=NOW)


def test_another_key_or_purpose_is_refused() -> None:
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        links.verify(b"other", "preferences", token(), now=NOW)
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        links.verify(KEY, "inbox", token(), now=NOW)


def test_expiry_is_exact_on_the_given_clock() -> None:
    at = datetime.fromtimestamp(EXPIRES, tz=UTC)
    assert links.verify(KEY, "preferences", token(), now=at - timedelta(seconds=1)) == "ann"
    with pytest.raises(
        ExpiredLink, match=r"^the link expired at 2026-12-07T10:00:00\+00:00$"
    ) as caught:
        links.verify(KEY, "preferences", token(), now=at)
    assert caught.value.expired_at == at


def test_the_signature_is_checked_before_the_expiry() -> None:
    """A tampered expired token says "bad", not "expired": nothing of it is believed unsigned."""
    old = token(expires=EXPIRES - 7200)
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        links.verify(KEY, "preferences", old[:-2] + "AA", now=NOW)


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


def test_a_preferences_token_expires_on_the_injected_clock(env) -> None:
    made = preference_links.preferences_token("ann", ttl="1h")
    assert preference_links.read_preferences_token(made) == "ann"
    clock.set_source(lambda: NOW + timedelta(minutes=59, seconds=59))
    assert preference_links.read_preferences_token(made) == "ann"
    clock.set_source(lambda: NOW + timedelta(hours=1))
    with pytest.raises(ExpiredLink, match=r"^the link expired at "):
        preference_links.read_preferences_token(made)


def test_the_secret_signs_and_a_new_secret_revokes_every_link(env) -> None:
    made = preference_links.preferences_token("ann")
    env.setenv("CLARION_LINK_SECRET", "rotated")
    settings.reset()
    with pytest.raises(BadLink, match=r"^the link's signature does not verify$"):
        preference_links.read_preferences_token(made)
    assert preference_links.read_preferences_token(preference_links.preferences_token("ann"))


def test_the_default_key_is_derived_not_the_webhook_secret_itself() -> None:
    derived = links.link_key(Settings(webhook_secret="hook"))
    assert derived != b"hook" and len(derived) == 32
    assert derived != links.link_key(Settings(webhook_secret="other"))
    assert links.link_key(Settings(webhook_secret="hook", link_secret="mine")) == b"mine"


def test_the_public_development_secret_is_refused_with_a_database() -> None:
    real = {"CLARION_DATABASE_URL": "postgresql://db/c", "CLARION_WEBHOOK_SECRET": "mine"}
    with pytest.raises(ConfigurationError, match="CLARION_LINK_SECRET"):
        from_env({**real, "CLARION_LINK_SECRET": settings.DEV_WEBHOOK_SECRET})
    with pytest.raises(ConfigurationError, match="CLARION_LINK_SECRET is set but empty"):
        from_env({"CLARION_LINK_SECRET": ""})
    assert from_env(real).link_secret is None  # derived from the (checked) webhook secret
    assert "link_secret='***'" in repr(from_env({**real, "CLARION_LINK_SECRET": "s3"}))


def test_the_form_token_is_bound_to_its_link() -> None:
    one, two = token("ann"), token("ann", expires=EXPIRES + 1)
    form = links.form_token(KEY, one)
    assert links.check_form_token(KEY, one, form)
    assert not links.check_form_token(KEY, two, form)
    assert not links.check_form_token(b"other", one, form)
    assert not links.check_form_token(KEY, one, "")
    assert not links.check_form_token(KEY, one, form[:-1] + "\udcff")


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(3600, 3600.0), ("90s", 90.0), ("30m", 1800.0), ("12h", 43200.0), ("7d", 604800.0)]
    + [("2w", 1209600.0), (" 45 ", 45.0), (timedelta(days=1), 86400.0), ("366d", 366 * 86400.0)],
)
def test_ttls(given, seconds) -> None:
    assert links.parse_ttl(given) == seconds


@pytest.mark.parametrize(
    "given", ["", "0", "0d", "-1d", "367d", "7y", "d", "1.5h", True, None, float("nan"), 10**9]
)
def test_bad_ttls_name_the_field(given) -> None:
    with pytest.raises(InvalidRequest, match="ttl"):
        links.parse_ttl(given)


# --- the form -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gates_catalog() -> Catalog:
    return Catalog.from_dict(page_catalog(), "page catalog")


def test_only_the_changed_cells_become_settings(gates_catalog) -> None:
    form = {
        "was": ["tip/in_app:1", "promo/in_app:0", "kickoff/in_app:1"],
        "on": ["promo/in_app", "kickoff/in_app"],
    }
    assert view.changes(gates_catalog, form) == {
        "type:tip/in_app": False,
        "type:promo/in_app": True,
    }
    assert view.changes(gates_catalog, {}) == {}


NOT_OFFERED = "is not a setting the page offers"


@pytest.mark.parametrize(
    ("form", "refusal"),
    [
        ({"was": ["receipt/in_app:1"]}, f"'receipt/in_app' {NOT_OFFERED}"),  # locked
        ({"was": ["security_code/in_app:0"]}, f"'security_code/in_app' {NOT_OFFERED}"),  # locked
        ({"was": ["nope/in_app:1"]}, f"'nope/in_app' {NOT_OFFERED}"),
        ({"was": ["tip/email:1"]}, f"'tip/email' {NOT_OFFERED}"),  # not a channel of the type
        ({"was": ["tip/webhook:1"]}, f"'tip/webhook' {NOT_OFFERED}"),  # never on the page
        ({"was": ["tip/in_app:2"]}, "bad was field 'tip/in_app:2'"),
        ({"was": ["tip/in_app"]}, "bad was field 'tip/in_app'"),
        ({"was": ["tip/in_app:1", "tip/in_app:0"]}, "bad was field 'tip/in_app:0'"),
        ({"was": ["tip/in_app:1"], "on": ["promo/in_app"]}, "a checked box the page did not show"),
    ],
)
def test_a_form_the_page_did_not_offer_is_stale(gates_catalog, form, refusal) -> None:
    with pytest.raises(view.StaleForm, match=f"^{re.escape(refusal)}$"):
        view.changes(gates_catalog, form)


def test_locked_types_are_shown_fixed_with_the_reason(gates_catalog) -> None:
    resolved = {
        "types": {
            t.key: {c: {"enabled": t.category != "marketing"} for c in t.channels}
            for t in gates_catalog.types.values()
        }
    }
    groups = {g.category: g for g in view.groups(gates_catalog, resolved)}
    assert list(groups) == [
        "transactional",
        "security",
        "alert",
        "activation",
        "digest",
        "marketing",
    ]
    receipt = groups["transactional"].rows[0]
    assert receipt.key == "receipt" and all(c.locked and c.enabled for c in receipt.cells)
    assert receipt.note and "cannot be turned off" in receipt.note
    outage = next(r for r in groups["alert"].rows if r.key == "outage")
    assert outage.note == view.CRITICAL_NOTE and not outage.cells[0].locked
    promo = groups["marketing"].rows[0]
    assert [(c.label, c.enabled) for c in promo.cells] == [("In the app", False)]  # no webhook
    ids = [c.id for g in groups.values() for r in g.rows for c in r.cells]
    assert len(ids) == len(set(ids))
