"""The support staff's activity page in a real browser: Debian's Chromium (/usr/bin/chromium,
installed by `make browser`) driven by Playwright, against clarion's ASGI app served by uvicorn in
a thread, on real PostgreSQL and Redis.

One recipient with four stories made through the real pipeline (tests/support/activity.py): a
receipt sent and bounced, the next one suppressed, a tip deferred by quiet hours, a Teams nudge
held as unknown. Signed in with an `activity:read` key, a search shows every step with its reason
in words and its time in the recipient's zone and in the viewer's; a staff link opens the same
page. No key, a key of another scope, a tampered or expired staff link and a recipient's
preferences link are refused, and the refusal shows no data. What is asserted is what a person
reads: headings, table captions and cells through the accessibility tree. Screenshots are kept
under the test's tmp dir.

Without Chromium this test fails with the reason: a skip would hide a missing install step."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from clarion import settings
from clarion.standins.fake_slack import serving
from clarion.tasks.links import preferences_token
from clarion.web.activity import staff_link, staff_token
from clarion.web.api_auth import create_key
from tests.support.activity import BOUNCE, MONDAY, Stories, four_stories
from tests.support.pipeline import configure

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def web(clarion_env, monkeypatch) -> Iterator[tuple[str, Stories]]:
    with four_stories(settings.get().webhook_secret, monkeypatch) as stories:
        from clarion.web.app import create_app

        with serving(create_app()) as url:
            configure(monkeypatch, public_url=url)
            yield url, stories


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: `make browser` (run by `make test`) installs Debian's "
            "chromium with apt-get; this test drives that browser, never a downloaded one"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            launched.close()


def bearer(*scopes: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_key('support', scopes).secret}"}


def story(page, request_id: int) -> str:
    """The words of one request's table, as the accessibility tree names it (by its caption)."""
    table = page.get_by_role("table", name=f"What happened to request {request_id}, in time order")
    assert table.count() == 1
    return table.inner_text()


def test_a_search_shows_every_step_with_its_reason_and_both_times(web, browser, tmp_path):
    url, stories = web
    page = browser.new_context(extra_http_headers=bearer("activity:read")).new_page()
    answer = page.goto(f"{url}/activity")
    assert answer is not None and answer.status == 200
    assert page.get_attribute("html", "lang") == "en"
    assert page.get_by_role("heading", level=1).inner_text() == "Notification activity"

    page.get_by_label("User id").fill("ann")
    page.get_by_label("Your time zone").fill("Europe/Berlin")
    with page.expect_navigation():
        page.get_by_role("button", name="Search").click()
    page.screenshot(path=str(tmp_path / "activity.png"), full_page=True)
    assert (tmp_path / "activity.png").stat().st_size > 10_000

    assert page.get_by_role("heading", level=2).inner_text() == "Recipient ann"
    titles = page.get_by_role("heading", level=3).all_inner_texts()
    assert titles[0] == "On the suppression list"
    assert {
        f"Request {stories.bounced}: receipt_webhook (event order-1)",
        f"Request {stories.suppressed}: receipt_webhook (event order-2)",
        f"Request {stories.deferred}: tip_inapp (event tip-1)",
        f"Request {stories.unknown}: nudge_teams (event nudge-1)",
    } == set(titles[1:])
    # every column has a header cell of its own; every step row is headed by what happened
    headers = page.locator("table").first.get_by_role("columnheader").all_inner_texts()
    assert headers[:2] == ["Since, their time", "Since, your time"]
    cols = page.get_by_role(
        "table", name=f"What happened to request {stories.bounced}, in time order"
    )
    assert cols.get_by_role("columnheader").all_inner_texts() == [
        "Their time (America/New_York)",
        "Your time (Europe/Berlin)",
        "Step",
        "Channel",
        "Reason",
        "Detail",
    ]

    # 09:00 UTC is 04:00 in New York and 10:00 in Berlin: both shown for the same step
    bounced = story(page, stories.bounced)
    assert "2026-12-07 04:00:00 EST" in bounced and "2026-12-07 10:00:00 CET" in bounced
    assert "The app asked for a receipt_webhook notification (event order-1)." in bounced
    assert "Sent through webhook." in bounced
    assert "The provider reports it bounced" in bounced and BOUNCE in bounced
    assert "Outcome: sent on webhook (bounced)" in page.inner_text("main")

    suppressed = story(page, stories.suppressed)
    assert "The address is on the suppression list" in suppressed
    assert "No channel was left to send on, so nothing was sent." in suppressed

    deferred = story(page, stories.deferred)
    assert "Held back during the recipient's quiet hours; sent when they end." in deferred
    assert "quiet hours in America/New_York until 2026-12-07T07:00:00-05:00" in deferred

    unknown = story(page, stories.unknown)
    assert "Held as unknown and not sent again, so it cannot arrive twice." in unknown
    assert "An attempt's answer was lost: it may or may not have arrived." in unknown
    assert "now held: outcome unknown" in unknown
    assert (
        "Outcome: outcome unknown on teams: may have arrived; held, not sent again"
        in page.inner_text("main")
    )

    # the suppression list names the bounce too, in words
    listed = page.get_by_role("table", name="Addresses no notification is sent to").inner_text()
    assert "webhook" in listed and "bounced" in listed

    # a search by event id finds the one request
    page.get_by_label("User id").fill("")
    page.get_by_label("Event id").fill("tip-1")
    with page.expect_navigation():
        page.get_by_role("button", name="Search").click()
    assert page.get_by_role("heading", level=3).all_inner_texts()[1:] == [
        f"Request {stories.deferred}: tip_inapp (event tip-1)"
    ]


def test_a_staff_link_opens_the_page_and_keeps_its_token_in_the_search(web, browser, tmp_path):
    url, stories = web
    page = browser.new_context().new_page()
    answer = page.goto(staff_link("sam", ttl="1h") + "&tz=UTC&request=" + str(stories.unknown))
    assert answer is not None and answer.status == 200
    assert "2026-12-07 09:00:00 UTC" in story(page, stories.unknown)
    page.get_by_label("Request id").fill(str(stories.bounced))
    with page.expect_navigation():
        page.get_by_role("button", name="Search").click()  # the hidden token goes along
    assert "The provider reports it bounced" in story(page, stories.bounced)
    page.screenshot(path=str(tmp_path / "activity-staff-link.png"), full_page=True)


def test_no_key_another_scope_and_bad_links_are_refused_and_show_nothing(web, browser, tmp_path):
    url, stories = web
    search = f"user=ann&request={stories.bounced}"
    payload, _, mac = staff_token("sam").partition(".")
    tampered = f"{payload}.{mac[:-4]}{'AAAA' if mac[-4:] != 'AAAA' else 'BBBB'}"
    expired = staff_token("sam", ttl=60, now=MONDAY - timedelta(hours=2))
    page = browser.new_context().new_page()
    for name, headers, query, status, heading in (
        ("nobody", {}, search, 401, "Sign-in needed"),
        ("other-scope", bearer("requests:read"), search, 403, "Not allowed"),
        ("tampered", {}, f"s={tampered}&{search}", 403, "This staff link does not work"),
        ("expired", {}, f"s={expired}&{search}", 401, "This staff link has expired"),
        (
            "preferences",
            {},
            f"s={preferences_token('ann')}&{search}",
            403,
            "This staff link does not work",
        ),
    ):
        page.set_extra_http_headers(headers)
        answer = page.goto(f"{url}/activity?{query}")
        assert answer is not None and answer.status == status, name
        assert page.get_by_role("heading", level=1).inner_text() == heading, name
        text = page.inner_text("main")
        assert "ann" not in text and "bounced" not in text and "webhook" not in text, name
        assert page.locator("table, form").count() == 0, name
        if name == "tampered":
            page.screenshot(path=str(tmp_path / "activity-refused.png"))
