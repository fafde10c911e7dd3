"""Every channel's provider request shows hostile rendered content as the text it is, and the
escaping comes from the one module (adapters/escape.py): no adapter escapes on its own."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from twilio.rest import Client

from clarion.adapters import apns, console, fcm, inapp, slack, teams
from clarion.adapters.email_mime import Identities, build
from clarion.adapters.sms import SmsAdapter, budget_quota
from clarion.records import Message
from tests.support.syntax import parse

ADAPTERS = Path(slack.__file__).parent
# What a variable could carry: a Slack ping and link, card/markdown link, HTML, a bidi override
# that shows "exe.pdf" as "fdp.exe", a terminal escape, a NUL.
HOSTILE = (
    "<!channel> <https://evil.example|click> [login](https://evil.example) "
    "<script>alert(1)</script> **bold** \u202eexe.pdf \x1b[31mred\x00"
)
DANGEROUS_PLAIN = ("\u202e", "\x1b", "\x00")


def message(channel: str, address: str | None) -> Message:
    return Message(
        delivery_id=7,
        user_id="ann",
        type_key="t",
        occurrence_key="event:e1",
        channel=channel,
        content={"title": "Hi " + HOSTILE, "body": "Body " + HOSTILE},
        address=address,
        category="transactional",
    )


def test_slack_block_kit_has_no_ping_or_link_from_content() -> None:
    args = slack.post_args(message("slack", "U1"))
    section = args["blocks"][1]["text"]["text"]
    for text in (section, args["text"]):
        assert "<!channel>" not in text and "<https://" not in text
        assert "&lt;!channel&gt;" in text
    assert args["blocks"][0]["text"]["type"] == "plain_text"  # the header is never mrkdwn


def test_teams_card_text_has_no_link_or_markup_from_content() -> None:
    card = teams.to_card(message("teams", "29:x"))
    texts = [b["text"] for b in card["body"]]
    for text in texts:
        assert "](" not in text.replace("\\]\\(", "")
        assert "\\*\\*bold\\*\\*" in text and "\\<script\\>" in text


def test_email_html_escapes_and_both_parts_lose_hidden_characters() -> None:
    email = build(
        message("email", "ann@example.com"),
        identities=Identities("Clarion <n@example.com>"),
        public_url="http://127.0.0.1:8000",
        secret="s" * 32,
    )
    assert "<script>" not in email.html and "&lt;script&gt;" in email.html
    for part in (email.html, email.text, email.subject):
        assert not any(ch in part for ch in DANGEROUS_PLAIN)


def test_sms_body_is_plain_text() -> None:
    adapter = SmsAdapter(
        Client("AC" + "0" * 32, "x"),
        sender="+15555550000",
        public_url="http://127.0.0.1:8000",
        quota=budget_quota(1),
    )
    body = adapter.to_request(message("sms", "+15555550100")).body
    assert not any(ch in body for ch in DANGEROUS_PLAIN)
    assert "exe.pdf" in body and "<script>" in body  # SMS shows text as text: nothing to escape


def test_push_payloads_are_plain_text() -> None:
    msg = message("push", "fcm:tok")
    notification = fcm.to_request(msg, "tok", "c")["message"]["notification"]
    alert = json.loads(apns.payload(msg))["aps"]["alert"]
    for text in [*notification.values(), *alert.values()]:
        assert not any(ch in text for ch in DANGEROUS_PLAIN)


def test_in_app_item_and_console_line_are_plain_text() -> None:
    item = inapp.to_request(message("in_app", None))
    line = console.to_line(message("console", None))
    for text in (item.title, item.body, line):
        assert not any(ch in text for ch in DANGEROUS_PLAIN)


def test_no_adapter_escapes_on_its_own() -> None:
    """Only adapters/escape.py imports an escaping library; the channels import from it."""
    escapers = {"markupsafe", "html"}
    for path in ADAPTERS.glob("*.py"):
        if path.name == "escape.py":
            continue
        tree = parse(path)
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        assert not imported & escapers, path.name
    users = {
        p.name
        for p in ADAPTERS.glob("*.py")
        if "from clarion.adapters.escape import" in p.read_text()
    }
    assert {"slack.py", "teams.py", "email_mime.py", "sms.py", "push.py", "inapp.py"} <= users
