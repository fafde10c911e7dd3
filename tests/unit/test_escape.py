"""Per-channel escaping (adapters/escape.py): content shows as the text it is.

Card markdown is checked against a real CommonMark renderer (markdown-it-py, which is also what the
Adaptive Cards JavaScript renderer uses): escaped text renders with no link, image, emphasis, list,
heading or code, and reads back as the original text.
"""

from __future__ import annotations

import html as html_lib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from clarion.adapters.escape import card_markdown, html, plain_text, slack_mrkdwn

COMMONMARK = MarkdownIt("commonmark")
ALLOWED_TAGS = {
    "p",
    "/p",
    "br /",
    "br",
    "pre",
    "/pre",
    "code",
    "/code",
}  # paragraphs; indented text as code
TAG = re.compile(r"<([^>]*)>")


def rendered(text: str) -> tuple[set[str], str]:
    """(the tags CommonMark renders for `text`, its visible text with whitespace collapsed)."""
    out = COMMONMARK.render(text)
    tags = set(TAG.findall(out))
    visible = html_lib.unescape(TAG.sub(" ", out))
    return tags, " ".join(visible.split())


def unescaped_link(text: str) -> bool:
    """Does card text hold link or image syntax that a renderer ignoring backslashes would see?"""
    return "](" in text.replace("\\]\\(", "")


@pytest.mark.parametrize(
    "text",
    [
        "[Reset your password](https://evil.example)",
        "![x](https://evil.example/a.png)",
        "**bold** and _italic_ and ~~strike~~ and `code`",
        "# Heading\n## Sub",
        "- item\n* item\n+ item\n1. one\n2) two",
        "Title\n=====\nOther\n-----",
        "> quoted\n\n---\n***\n___",
        "<https://evil.example> <b>html</b> &amp; &#x5B;",
        "[ref]: https://evil.example\n[ref]",
        "{{DATE(2017-02-14T06:08:00Z, SHORT)}}",
        "back\\slash \\[ already\\](escaped)",
        "```\nfenced\n```",
        "line\rbreaks\r\n- list after CR",
        "[a](b)[c](d) ![e](f) [g] (h)",
    ],
)
def test_card_markdown_renders_as_the_text_it_was(text):
    escaped = card_markdown(text)
    tags, visible = rendered(escaped)
    assert tags <= ALLOWED_TAGS, (escaped, tags)
    assert visible == " ".join(text.split())
    assert not unescaped_link(escaped)


def test_plain_prose_is_left_alone():
    prose = "Hi Mia, your growth plan starts today. Ready to pick your first focus? Let's go (now) & 50%!"
    assert card_markdown(prose) == prose


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    st.text(
        alphabet=st.sampled_from(list("[]()!*_~`#-+=>|<&;{}\\.:/ \n\r\t1aZ")) | st.characters(),
        max_size=60,
    )
)
def test_no_text_renders_as_markup_on_a_card(text):
    escaped = card_markdown(text)
    tags, visible = rendered(escaped)
    assert tags <= ALLOWED_TAGS, (escaped, tags)
    # NUL becomes U+FFFD in CommonMark; everything else reads back as written
    assert visible == " ".join(text.replace("\x00", "\ufffd").split())
    assert not unescaped_link(escaped)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "a & b <!channel> <https://evil.example|Reset>",
            "a &amp; b &lt;!channel&gt; &lt;https://evil.example|Reset&gt;",
        ),
        ("*bold* _it_", "*bold* _it_"),  # Slack has no escapes: emphasis is harmless, links are not
        ("&amp;", "&amp;amp;"),
    ],
)
def test_slack_mrkdwn(text, expected):
    assert slack_mrkdwn(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<a href="https://evil.example">x</a>',
            "&lt;a href=&#34;https://evil.example&#34;&gt;x&lt;/a&gt;",
        ),
        ("Tom & Jerry's", "Tom &amp; Jerry&#39;s"),
    ],
)
def test_html(text, expected):
    assert html(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("code 1234\x00\x07\x1b[31m", "code 1234[31m"),
        ("pay \u202eexe.gpj", "pay exe.gpj"),  # a right-to-left override disguising a file name
        ("two\nlines\tand tab\r", "two\nlines\tand tab"),
        ("lone \ud800 surrogate", "lone  surrogate"),
        ("Grüße, 你好 👋", "Grüße, 你好 👋"),
    ],
)
def test_plain_text(text, expected):
    assert plain_text(text) == expected
