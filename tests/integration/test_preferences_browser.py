"""The preferences page in a real browser: Debian's Chromium (/usr/bin/chromium, installed by
`make browser`, which `make test` runs) driven by Playwright, against clarion's ASGI app served by
uvicorn in a thread, on real PostgreSQL and Redis.

Open a signed link, toggle a type off with the keyboard (Tab reaches every box and the button,
Space toggles), save; the next notify() of that type for that user is suppressed as `opted_out`.
An expired link, a tampered one, and a page whose link expires (on the injected clock) before its
form is sent each get a clear page and change nothing. Screenshots are kept as artefacts under
the test's tmp dir and .clarion/artefacts/.

Without Chromium this test fails with the reason: a skip would hide a missing install step."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from clarion.catalog import RECIPIENT_CHANNELS
from clarion.standins.fake_slack import serving
from clarion.tasks import preferences_link, register_recipient
from clarion.tasks.links import preferences_token
from clarion.tasks.preferences import get_preferences
from tests.support.environment import ROOT
from tests.support.gates import decisions_of, rows, send_and_route, use_page_catalog
from tests.support.pipeline import Clock, configure, frozen_clock, publishing_to_this_tests_broker

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
ARTEFACTS = ROOT / ".clarion" / "artefacts"
MONDAY = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


@pytest.fixture
def web(clarion_env, monkeypatch, tmp_path) -> Iterator[str]:
    use_page_catalog(monkeypatch, tmp_path)
    register_recipient("ann", timezone="Europe/Berlin", country="DE")
    from clarion.web.app import create_app

    with serving(create_app()) as url, publishing_to_this_tests_broker():
        configure(monkeypatch, public_url=url)
        yield url


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


@pytest.fixture
def vclock() -> Iterator[Clock]:
    with frozen_clock(MONDAY) as c:
        yield c


def keep(page, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot in the test's tmp dir, copied to .clarion/artefacts/."""
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTEFACTS / name)
    print(f"screenshot: {shot} (and {ARTEFACTS / name})")
    return shot


def stored() -> list[tuple]:
    return rows("SELECT user_id, scope, key, channel, enabled FROM preferences ORDER BY 1, 2, 3, 4")


def focused(page) -> dict:
    return page.evaluate(
        """() => { const e = document.activeElement, s = getComputedStyle(e);
        return {tag: e.tagName, id: e.id, value: e.value || null, type: e.type || null,
                outline: s.outlineStyle, width: parseFloat(s.outlineWidth)}; }"""
    )


def luminance(rgb: str) -> float:
    channels = [int(v) / 255 for v in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3]]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(fg: str, bg: str) -> float:
    a, b = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def test_toggle_off_in_chromium_then_notify_is_opted_out(web, browser, tmp_path, vclock) -> None:
    page = browser.new_context().new_page()  # a context of its own: no state shared between tests
    answer = page.goto(preferences_link("ann", ttl="1h"))
    assert answer is not None and answer.status == 200
    assert page.get_attribute("html", "lang") == "en"
    assert page.locator("fieldset").count() == page.locator("fieldset > legend").count() == 6

    boxes = page.get_by_role("checkbox")
    resolved = get_preferences("ann")["types"]  # one box per type and channel a person may choose
    assert boxes.count() == sum(c in RECIPIENT_CHANNELS for t in resolved.values() for c in t)
    for i in range(boxes.count()):  # every box has a label naming its type and channel
        assert page.locator(f"label[for='{boxes.nth(i).get_attribute('id')}']").count() == 1
    receipt = page.get_by_role("checkbox", name="Order receipts: In the app (always on)")
    assert receipt.is_disabled() and receipt.is_checked()
    reason = page.locator(f"#{receipt.get_attribute('aria-describedby')}")
    assert "cannot be turned off" in reason.inner_text()

    enabled = [
        boxes.nth(i).get_attribute("value")
        for i in range(boxes.count())
        if boxes.nth(i).is_enabled()
    ]
    reached = []
    for _ in range(len(enabled) + 1):  # Tab through every box to the button; disabled are skipped
        page.keyboard.press("Tab")
        now = focused(page)
        assert now["outline"] != "none" and now["width"] >= 2, now  # focus is visible
        reached.append(now)
        if now["value"] == "stalled_plan/in_app":
            target = page.get_by_role("checkbox", name="A quiet growth plan: In the app")
            assert target.is_checked()
            page.keyboard.press("Space")
            assert not target.is_checked()
            keep(page, tmp_path, "preferences.png")  # focus ring on the toggled box
    assert [r["value"] for r in reached[:-1]] == enabled
    assert reached[-1]["tag"] == "BUTTON"

    for selector in ("label", "legend", ".note", "h1", "button"):
        colours = page.eval_on_selector(
            selector,
            """e => { let s = getComputedStyle(e), b = e, bg = 'rgba(0, 0, 0, 0)';
            while (b && (bg = getComputedStyle(b).backgroundColor) === 'rgba(0, 0, 0, 0)') b = b.parentElement;
            return [s.color, b ? bg : 'rgb(255, 255, 255)']; }""",
        )
        assert contrast(*colours) >= 4.5, (selector, colours)

    with page.expect_navigation():
        page.keyboard.press("Enter")  # on the focused Save button
    assert "Saved. 1 setting changed." in page.get_by_role("status").inner_text()
    assert not page.get_by_role("checkbox", name="A quiet growth plan: In the app").is_checked()
    keep(page, tmp_path, "preferences-saved.png")
    assert get_preferences("ann")["settings"] == {"type:stalled_plan/in_app": False}

    request_id = send_and_route("ann", "stalled_plan")
    first = decisions_of("ann", request_id)[0]
    assert first[:4] == ("preferences", "suppress", "opted_out", "in_app")


def test_expired_and_tampered_links_get_a_clear_page_and_change_nothing(
    web, browser, tmp_path, vclock
) -> None:
    page = browser.new_context().new_page()
    before = stored()
    expired = preferences_token("ann", ttl=60, now=MONDAY - timedelta(minutes=5))
    payload, _, mac = preferences_token("ann").partition(".")
    tampered = f"{payload}.{mac[:-4]}{'AAAA' if mac[-4:] != 'AAAA' else 'BBBB'}"
    for token, status, words, shot in (
        (expired, 410, "This link has expired", "preferences-expired.png"),
        (tampered, 403, "This link does not work", "preferences-tampered.png"),
    ):
        answer = page.goto(f"{web}/preferences?t={token}")
        assert answer is not None and answer.status == status
        assert page.get_by_role("heading", level=1).inner_text() == words
        assert "Nothing was changed." in page.inner_text("main")
        assert page.locator("form").count() == 0
        keep(page, tmp_path, shot)
    assert stored() == before

    # a page opened in time whose link expires before the form is sent saves nothing
    page.goto(preferences_link("ann", ttl="10m"))
    page.get_by_role("checkbox", name="Weekly tips: In the app").uncheck()
    vclock.advance(600)
    with page.expect_navigation():
        page.get_by_role("button", name="Save settings").click()
    assert page.get_by_role("heading", level=1).inner_text() == "This link has expired"
    assert stored() == before


def test_types_show_their_labels_and_no_internal_channel(web, browser, tmp_path, vclock) -> None:
    """Titles are the catalog's labels (the key as words without one), with the description; no
    checkbox offers webhook or console (catalog.RECIPIENT_CHANNELS)."""
    page = browser.new_context().new_page()
    answer = page.goto(preferences_link("ann", ttl="1h"))
    assert answer is not None and answer.status == 200
    titles = page.locator("h3").all_inner_texts()
    assert {"Order receipts", "A quiet growth plan", "Weekly tips"} <= set(titles)
    assert {"Security code", "Daily summary"} <= set(titles)  # unlabelled: the key as words
    assert not any("_" in t for t in titles), titles
    quiet = page.get_by_role("group", name="A quiet growth plan")
    assert quiet.get_attribute("aria-describedby")
    about = page.locator(f"#{quiet.get_attribute('aria-describedby').split()[0]}")
    assert about.inner_text() == "A reminder when your plan has had no activity for a while."
    assert about.is_visible()
    labels = page.locator("label").all_inner_texts()
    assert labels and all(t.split(":")[-1].split()[:3] == ["In", "the", "app"] for t in labels), (
        labels
    )
    text = page.inner_text("main")
    assert "Webhook" not in text and "Console" not in text
    assert page.locator("input[value$='/webhook'], input[value$='/console']").count() == 0
    keep(page, tmp_path, "preferences-labels.png")
