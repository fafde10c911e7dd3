"""Escaping per channel, in one place: content is data, and only what a channel would render as
formatting is neutralised, so that text shows as the text it is.

- `slack_mrkdwn`: Slack's three control characters (`&`, `<`, `>`): no links (`<url|text>`),
  mentions or `<!channel>` pings from content. Slack has no backslash escapes; bare URLs stay
  visible as URLs.
- `card_markdown`: Adaptive Card TextBlock markdown (a CommonMark subset: bold, italic, lists,
  links; Teams renders more than the documented subset, and `{{DATE(...)}}` functions). CommonMark
  backslash escapes for the characters that open markup anywhere, and for list, heading and
  setext markers at the start of a line. `]` and the `(` after it are both escaped, so even a
  renderer that ignores escapes never sees `](`: no link or image from content.
- `html`: HTML text and attribute values (markupsafe), for email bodies.
- `plain_text`: text for SMS and other plain channels: control characters and bidirectional
  overrides (which can disguise a link or a number) removed; newlines and tabs kept.
"""

from __future__ import annotations

import re
import unicodedata

from markupsafe import escape as _markup_escape

_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# anywhere: backslash, emphasis/strike/code, brackets, braces (card date functions), angle brackets
# (autolinks, HTML); "(" right after "]"; "&" that would start an entity reference
_CARD_INLINE = re.compile(r"[\\`*_~\[\]{}<>]|(?<=\])\(|&(?=#?[A-Za-z0-9]+;)")
# at the start of a line, after indentation: headings, list bullets, setext underlines, tables
_CARD_LINE_START = re.compile(r"^([ \t]*)([#+=|-])")
_CARD_NUMBERED = re.compile(r"^([ \t]*[0-9]+)([.)])")
_LINES = re.compile(r"(\r\n|\r|\n)")
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def slack_mrkdwn(text: str) -> str:
    """Text for a Slack mrkdwn field, shown as written."""
    return text.translate(_SLACK)


def card_markdown(text: str) -> str:
    """Text for an Adaptive Card TextBlock, shown as written (no link, image, emphasis, list...)."""
    parts = _LINES.split(text)
    for i in range(0, len(parts), 2):  # odd indices are the line breaks themselves
        line = _CARD_INLINE.sub(lambda m: "\\" + m.group(0), parts[i])
        line = _CARD_LINE_START.sub(r"\1\\\2", line)
        parts[i] = _CARD_NUMBERED.sub(r"\1\\\2", line)
    return "".join(parts)


def html(text: str) -> str:
    """Text for an HTML body or attribute: `& < > " '` as entities."""
    return str(_markup_escape(text))


def plain_text(text: str) -> str:
    """Text for a plain-text channel: no control characters (but newline and tab), no bidi overrides,
    no lone surrogates."""
    return "".join(ch for ch in text if ch in "\n\t" or not _hidden(ch))


def _hidden(ch: str) -> bool:
    return ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cs")
