"""The Anthropic summariser through the official SDK, pointed at a local Messages API.

Each fault is produced by the local server and counted there: a stall past the digest's 1 s
timeout, a 529, a refusal, a body that is not JSON. Each gives the fallback line, in time, and the
digest is still sent; one call per digest (the SDK's retries are off). A good answer is used.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import anthropic  # noqa: F401 - the ai extra is in the test install: missing fails, not skips
import pytest

from clarion import clock, settings
from clarion.standins.fake_anthropic import FakeAnthropic
from clarion.standins.receiver import Receiver
from clarion.tasks import register_recipient
from tests.support.digests import digest_requests, flush_due, use_digest_catalog
from tests.support.gates import VirtualClock, deliveries_of, rows, send_and_route
from tests.support.pipeline import configure

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
TIMEOUT = 1.0  # options.digest.summary_timeout of claude_note


@pytest.fixture
def claude(clarion_env, monkeypatch) -> Iterator[tuple[FakeAnthropic, Receiver]]:
    use_digest_catalog(monkeypatch)
    with FakeAnthropic() as fake, Receiver(settings.get().webhook_secret) as receiver:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
        configure(monkeypatch, webhook_url=receiver.url)
        c = VirtualClock(T0)
        try:
            yield fake, receiver
        finally:
            c.close()


def _digest_of_two(user: str) -> tuple[dict, float]:
    register_recipient(user, timezone="UTC")
    send_and_route(user, "claude_note")
    send_and_route(user, "claude_note")
    due = rows("SELECT max(due_at) FROM requests WHERE user_id = :u", u=user)[0][0]
    clock.set_source(lambda: due)
    started = time.monotonic()
    flush_due()
    return digest_requests(user, "ai_digest")[-1], time.monotonic() - started


@pytest.mark.parametrize("mode", ["stall", "5xx", "refusal", "garbage"])
def test_a_failing_model_gives_the_fallback_in_time_and_the_digest_is_sent(claude, mode):
    fake, receiver = claude
    fake.answer(mode)
    digest, took = _digest_of_two("kay")
    assert fake.calls == {mode: 1}, "one call per digest, counted at the server"
    assert fake.keys == ["sk-ant-test"]
    assert digest["variables"]["summary"] == "2 new updates"
    assert digest["variables"]["summary_source"] in ("timeout", "error")
    assert took < TIMEOUT + 1.5, f"the flush took {took:.2f} s with a {TIMEOUT} s timeout"
    assert [s for _, _, s in deliveries_of("kay", digest["id"])] == ["sent"]
    [content] = receiver.arrivals.contents.values()
    assert content["body"] == "2 new updates"


def test_a_good_answer_is_the_summary_line(claude):
    fake, receiver = claude
    digest, _ = _digest_of_two("lou")
    assert fake.calls == {"ok": 1}
    [body] = fake.bodies
    assert body["model"] == "claude-haiku-4-5" and body["max_tokens"] == 200
    assert "2 notifications" in body["messages"][0]["content"]
    assert digest["variables"]["summary"] == fake.line
    assert digest["variables"]["summary_source"] == "summariser"
    [content] = receiver.arrivals.contents.values()
    assert content["body"] == fake.line


def test_a_long_answer_is_junk(claude):
    fake, _ = claude
    fake.line = "word " * 100
    digest, _ = _digest_of_two("max")
    assert fake.calls == {"ok": 1}
    assert digest["variables"]["summary_source"] == "junk"
    assert digest["variables"]["summary"] == "2 new updates"
