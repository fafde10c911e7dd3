"""The local Messages API (standins/fake_anthropic.py) answers the official anthropic SDK as the API
does: a text block, a 529 overloaded_error, a refusal with no text, a body that is not JSON — each
counted by the mode it got, with the key the SDK sent."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from clarion.standins.fake_anthropic import FakeAnthropic


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(line="Two sellers answered") as running:
        yield running


def ask(fake: FakeAnthropic):
    sdk = anthropic.Anthropic(api_key="sk-test-key", base_url=fake.url, max_retries=0)
    return sdk.messages.create(
        model="claude-test", max_tokens=50, messages=[{"role": "user", "content": "sum up"}]
    )


def test_ok_is_one_text_block_ending_the_turn(fake):
    answer = ask(fake)
    assert [b.text for b in answer.content] == ["Two sellers answered"]
    assert answer.stop_reason == "end_turn" and answer.model == "claude-test"
    assert fake.calls == {"ok": 1} and fake.keys == ["sk-test-key"]
    assert fake.bodies[0]["messages"] == [{"role": "user", "content": "sum up"}]


def test_overloaded_is_a_529_the_sdk_raises(fake):
    fake.answer("5xx")
    with pytest.raises(
        anthropic.APIStatusError, match=r"^Error code: 529 .*overloaded_error"
    ) as failed:
        ask(fake)
    assert failed.value.status_code == 529
    assert ask(fake).content[0].text == "Two sellers answered"  # then as usual
    assert fake.calls == {"5xx": 1, "ok": 1}


def test_a_refusal_has_no_text(fake):
    fake.answer("refusal")
    answer = ask(fake)
    assert answer.stop_reason == "refusal" and answer.content == []


def test_garbage_is_not_json(fake):
    fake.answer("garbage")
    with pytest.raises(
        ValueError, match=r"^Expecting value: line 1 column 1"
    ):  # the SDK lets the JSONDecodeError through
        ask(fake)
    assert fake.calls == {"garbage": 1}


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        FakeAnthropic().answer("sometimes")
