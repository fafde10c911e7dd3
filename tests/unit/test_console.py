"""adapters/console.py: the printed line."""

from __future__ import annotations

import io

import pytest

from clarion.adapters.console import ConsoleAdapter, to_line
from clarion.records import Message, SendResult


def message(content: dict[str, str]) -> Message:
    return Message(1, "u-7", "plan_kickoff", "event:1", "console", content)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ({"title": "Hi", "body": "Go"}, "[console] to u-7 (plan_kickoff): Hi — Go"),
        ({"body": "Go"}, "[console] to u-7 (plan_kickoff):  — Go"),
        ({"title": "Hi"}, "[console] to u-7 (plan_kickoff): Hi — "),
        ({}, "[console] to u-7 (plan_kickoff):  — "),
        (
            {"title": "Hi", "body": "Go", "footer": "ignored"},
            "[console] to u-7 (plan_kickoff): Hi — Go",
        ),
        ({"title": "Grüße", "body": "日本"}, "[console] to u-7 (plan_kickoff): Grüße — 日本"),
    ],
)
def test_to_line(content: dict[str, str], line: str) -> None:
    assert to_line(message(content)) == line


def test_send_prints_one_line() -> None:
    stream = io.StringIO()
    adapter = ConsoleAdapter(stream)
    assert adapter.send(message({"title": "Hi", "body": "Go"})) == SendResult(platform="console")
    assert stream.getvalue() == "[console] to u-7 (plan_kickoff): Hi — Go\n"
    assert (adapter.channel, adapter.needs_address) == ("console", False)
