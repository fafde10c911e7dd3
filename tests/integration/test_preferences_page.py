"""The preferences page through its real door (Starlette's TestClient on web.app.create_app)
against real PostgreSQL: the signed link, the matrix it shows, saving through the preference
functions the API uses, and every refusal (expired, tampered, CSRF, cross-site, stale, oversized)
answered with a page in words that changed nothing. `clarion link` prints a link that opens it.

The same flow in a real browser (Chromium driven by Playwright) is test_preferences_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from starlette.testclient import TestClient

from clarion import clock
from clarion.errors import InvalidRequest, UnknownRecipient
from clarion.ops import cli
from clarion.tasks import preferences_link, register_recipient
from clarion.tasks.links import preferences_token
from clarion.tasks.preferences import get_preferences, set_preferences
from clarion.web.app import create_app
from tests.support.forms import Form
from tests.support.gates import decisions_of, rows, send_and_route, use_page_catalog
from tests.support.pipeline import configure

pytestmark = pytest.mark.integration


@pytest.fixture
def client(clarion_env, monkeypatch, tmp_path) -> Iterator[TestClient]:
    use_page_catalog(monkeypatch, tmp_path)
    configure(monkeypatch, public_url="http://testserver")
    register_recipient("ann", timezone="Europe/Berlin", country="DE")
    with TestClient(create_app()) as c:
        yield c


def path(user: str = "ann", **kw: Any) -> str:
    url = urlsplit(preferences_link(user, **kw))
    return f"{url.path}?{url.query}"


def stored() -> list[tuple]:
    return rows("SELECT user_id, scope, key, channel, enabled FROM preferences ORDER BY 1, 2, 3, 4")


def post(client: TestClient, url: str, fields: list, **headers: str):
    return client.post(
        url,
        content="&".join(f"{k}={v}" for k, v in fields),
        headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
    )


def test_the_page_shows_every_type_by_category_and_recipient_channel(client) -> None:
    answer = client.get(path())
    assert answer.status_code == 200
    page = answer.text
    assert '<html lang="en">' in page
    for header, value in {
        "cache-control": "no-store",
        "referrer-policy": "no-referrer",
        "x-frame-options": "DENY",
    }.items():
        assert answer.headers[header] == value
    assert "script-src" not in answer.headers["content-security-policy"]  # default-src 'none'
    form = Form(page)
    resolved = get_preferences("ann")["types"]
    # one box per type and channel a recipient may choose: in_app here, never webhook or console
    assert len(form.boxes) == len(resolved)
    offered = {(b.get("value") or "").partition("/")[2] for b in form.boxes.values()}
    assert offered == {"", "in_app"}  # "": the locked boxes, which post nothing
    assert "Webhook" not in page and "Console" not in page
    assert set(form.boxes) == set(form.labels)  # a label for every checkbox
    for box_id, box in form.boxes.items():
        if "disabled" in box:
            assert "(always on)" in form.labels[box_id] and "checked" in box
        else:
            key, _, channel = (box["value"] or "").partition("/")
            assert ("checked" in box) == resolved[key][channel]["enabled"]
    locked = [b for b in form.boxes.values() if "disabled" in b]
    assert len(locked) == 2  # receipt (transactional) and security_code (security)
    assert page.count("cannot be turned off, not even by unsubscribing from everything") == 2
    assert page.count("<fieldset>") == page.count("<legend>") == 6
    promo = [b for b in form.boxes.values() if (b.get("value") or "").startswith("promo/")]
    assert promo and not any("checked" in b for b in promo)  # marketing is opt-in in DE


def test_saving_writes_through_the_preference_functions_and_notify_is_opted_out(client) -> None:
    url = path()
    form = Form(client.get(url).text)
    assert form.action == "?" + url.partition("?")[2]
    answer = post(client, url, form.submit(off={"stalled_plan/in_app"}, on={"promo/in_app"}))
    assert answer.status_code == 200, answer.text
    assert "Saved. 2 settings changed." in answer.text
    assert get_preferences("ann")["settings"] == {
        "type:stalled_plan/in_app": False,
        "type:promo/in_app": True,
    }
    again = Form(answer.text)  # the page after saving shows the new state
    assert not any(
        "checked" in b for b in again.boxes.values() if b.get("value") == "stalled_plan/in_app"
    )

    request_id = send_and_route("ann", "stalled_plan")
    assert [(g, o, r) for g, o, r, _, _ in decisions_of("ann", request_id)][0] == (
        "preferences",
        "suppress",
        "opted_out",
    )

    before = stored()
    unchanged = post(client, url, again.submit())
    assert "Saved. Nothing was changed." in unchanged.text
    assert stored() == before


def test_a_save_sends_only_what_the_recipient_changed(client) -> None:
    """A setting changed elsewhere (the API) after the page was opened is not undone by saving
    the page with other changes."""
    url = path()
    form = Form(client.get(url).text)
    set_preferences("ann", {"type:tip/in_app": False})
    answer = post(client, url, form.submit(off={"kickoff/in_app"}))
    assert "Saved. 1 setting changed." in answer.text
    assert get_preferences("ann")["settings"] == {
        "type:tip/in_app": False,
        "type:kickoff/in_app": False,
    }


def tampered(token: str) -> list[str]:
    payload, _, mac = token.partition(".")
    flip = {"A": "B"}.get(mac[5], "A")
    return [f"{payload}.{mac[:5]}{flip}{mac[6:]}", f"{payload[:-1]}.{mac}", token[:-3], "", "x.y"]


def test_an_expired_or_tampered_link_gets_a_clear_page_and_changes_nothing(client) -> None:
    good = path()
    fields = Form(client.get(good).text).submit(off={"stalled_plan/in_app", "tip/in_app"})
    expired = preferences_token("ann", ttl=60, now=clock.now() - timedelta(minutes=2))
    before = stored()
    for method in ("get", "post"):
        for token in [expired, *tampered(preferences_token("ann"))]:
            url = f"/preferences?t={token}"
            answer = client.get(url) if method == "get" else post(client, url, fields)
            status, words = (
                (410, "This link has expired")
                if token == expired
                else (403, "This link does not work")
            )
            assert answer.status_code == status, (method, token)
            assert words in answer.text and "Nothing was changed." in answer.text
            assert '<html lang="en">' in answer.text and "Traceback" not in answer.text
            assert "<form" not in answer.text
    assert client.get("/preferences").status_code == 403
    assert stored() == before


def test_the_form_needs_its_csrf_token_and_a_same_site_origin(client) -> None:
    register_recipient("bob", timezone="UTC")
    url, bobs = path(), path("bob")
    fields = Form(client.get(url).text).submit(off={"stalled_plan/in_app"})
    bob_csrf = dict(Form(client.get(bobs).text).fields)["csrf"]
    without = [f for f in fields if f[0] != "csrf"]
    before = stored()
    cases = [
        (without, {}),
        (without + [("csrf", "")], {}),
        (without + [("csrf", bob_csrf)], {}),  # another link's form token
        (without + [("csrf", "x"), ("csrf", "y")], {}),
        (fields, {"Sec-Fetch-Site": "cross-site"}),
        (fields, {"Sec-Fetch-Site": "same-site"}),
    ]
    for body, headers in cases:
        answer = post(client, url, body, **headers)
        assert answer.status_code == 403 and "Your changes were not saved" in answer.text
    assert post(client, url, fields, **{"Sec-Fetch-Site": "same-origin"}).status_code == 200
    assert stored() != before


def test_forms_the_page_did_not_offer_change_nothing(client) -> None:
    url = path()
    fields = Form(client.get(url).text).submit()
    before = stored()
    bad = [
        fields + [("was", "receipt/in_app:1")],  # a locked type
        fields + [("was", "nope/in_app:0")],
        fields + [("on", "promo/email")],
        fields + [("was", "tip/webhook:1")],  # a channel the page never offers
    ]
    for body in bad:
        answer = post(client, url, body)
        assert answer.status_code == 400 and "Nothing was changed." in answer.text
    wrong_type = client.post(url, json={"on": "x"})
    assert wrong_type.status_code == 415
    huge = client.post(
        url,
        content="was=" + "x" * 300_000,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 413 and "Traceback" not in huge.text
    assert stored() == before


def test_output_is_escaped() -> None:
    from clarion.web.preferences import _html

    page = _html(200, title='<script>alert("x")</script>', text=["a & b <i>"]).body.decode()  # type: ignore[union-attr]
    assert "<script>" not in page and "&lt;script&gt;" in page and "a &amp; b &lt;i&gt;" in page


def test_links_name_known_recipients_and_a_sane_ttl(client) -> None:
    with pytest.raises(UnknownRecipient, match="unknown recipient 'nobody'"):
        preferences_link("nobody")
    with pytest.raises(InvalidRequest, match="ttl"):
        preferences_link("ann", ttl="0d")
    signed = preferences_token("ghost")  # signed for someone never registered
    answer = client.get(f"/preferences?t={signed}")
    assert answer.status_code == 404 and "No settings found" in answer.text


def test_clarion_link_prints_a_link_that_opens_the_page(client, capsys) -> None:
    with pytest.raises(SystemExit, match=r"^0$") as done:
        cli.main(["link", "--user", "ann", "--ttl", "2h"])
    assert done.value.code == 0
    url = capsys.readouterr().out.strip()
    assert re.fullmatch(r"http://testserver/preferences\?t=[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+", url)
    assert client.get(url).status_code == 200
    with pytest.raises(SystemExit, match=r"^2$") as refused:
        cli.main(["link", "--user", "nobody"])
    assert refused.value.code == 2
    assert "unknown recipient 'nobody'" in capsys.readouterr().err


def test_types_are_titled_with_their_labels_and_descriptions(client) -> None:
    page = client.get(path()).text
    titles = re.findall(r'<h3 id="n\d+-t">([^<]*)</h3>', page)
    assert {"Order receipts", "A quiet growth plan", "Weekly tips"} <= set(titles)
    assert "Security code" in titles and "Daily summary" in titles  # no label: the key as words
    assert not {"stalled_plan", "receipt", "security_code"} & set(titles)
    assert '<p class="description" id="n' in page
    assert "A reminder when your plan has had no activity for a while." in page
