"""Per channel, the provider request a preview shows: each built by the adapter's own code (its
`to_request`, or the pure function its `send` uses), plus (what, value) rows for a person."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from clarion import clock
from clarion.records import Message
from clarion.settings import Settings

Built = tuple[dict[str, Any], list[tuple[str, str]]]


def _email(message: Message, s: Settings) -> Built:
    from clarion.adapters.email_mime import Identities, build

    email = build(
        message,
        identities=Identities(s.email_from, s.email_from_marketing),
        public_url=s.public_url,
        secret=s.webhook_secret,
    )
    request = {
        "from": email.sender,
        "to": email.to,
        "subject": email.subject,
        "headers": [list(h) for h in email.headers],
        "text": email.text,
        "html": email.html,
    }
    return request, [
        ("from", email.sender),
        ("to", email.to),
        ("subject", email.subject),
        ("text", email.text.rstrip("\n")),
        ("html", _html_body(email.html)),
    ]


def _html_body(document: str) -> str:
    """The part of the email's HTML between <body> and </body> (the frame is fixed)."""
    start, end = document.find("<body>"), document.rfind("</body>")
    return document[start + len("<body>") : end].strip() if 0 <= start < end else document


def _slack(message: Message, s: Settings) -> Built:
    from clarion.adapters.slack import post_args

    request = {"channel": message.address, **post_args(message)}
    lines = [("text", request["text"])]
    lines += [("block", _compact(b)) for b in request["blocks"]]
    return request, lines


def _teams(message: Message, s: Settings) -> Built:
    from clarion.adapters.teams import to_card

    card = to_card(message)
    request = {"summary": message.content.get("title"), "card": card}
    lines = [("summary", str(request["summary"] or ""))]
    lines += [("card " + b["type"], b.get("text") or _compact(b)) for b in card.get("body", [])]
    lines += [("card action", a.get("title", "")) for a in card.get("actions", [])]
    return request, lines


def _sms(message: Message, s: Settings) -> Built:
    from twilio.rest import Client

    from clarion.adapters.sms import SmsAdapter, budget_quota, encoding

    adapter = SmsAdapter(
        Client("AC" + "0" * 32, "preview"),  # never called: to_request is pure
        sender=s.twilio_from or "+15555550000",
        public_url=s.public_url,
        quota=budget_quota(s.sms_segments_per_second),
    )
    sms = adapter.to_request(message)
    enc = encoding(sms.body)
    request = {**sms.create_args(), "encoding": enc, "segments": sms.segments}
    return request, [
        ("to", sms.to),
        ("body", sms.body),
        ("encoding", enc),
        ("segments", f"{sms.segments} ({len(sms.body)} characters)"),
    ]


def _push(message: Message, s: Settings) -> Built:
    from clarion.adapters import apns, fcm
    from clarion.adapters.push import collapse_id, title_and_body

    collapse = collapse_id(message)
    title, body = title_and_body(message)
    request = {
        "fcm": fcm.to_request(message, "<device token>", collapse),
        "apns": json.loads(apns.payload(message)),
        "collapse_id": collapse,
    }
    sizes = f"FCM {len(_compact(request['fcm']))} B, APNs {len(apns.payload(message))} B"
    return request, [
        ("title", title),
        ("body", body),
        ("collapse id", collapse),
        ("payloads", f"{sizes} (--json shows them)"),
    ]


def _in_app(message: Message, s: Settings) -> Built:
    from clarion.adapters.inapp import to_request

    item = asdict(to_request(message))
    return item, [
        ("title", item["title"]),
        ("body", item["body"]),
        ("data", _compact(item["data"])),
    ]


def _webhook(message: Message, s: Settings) -> Built:
    from clarion.adapters.webhook import to_request

    headers, body = to_request(message, s.webhook_secret, clock.now().timestamp())
    request = {"headers": headers, "body": json.loads(body)}
    return request, [("body", body.decode())]


def _console(message: Message, s: Settings) -> Built:
    from clarion.adapters.console import to_line

    line = to_line(message)
    return {"line": line}, [("line", line)]


def generic(message: Message, s: Settings) -> Built:
    return {"content": message.content}, sorted(message.content.items())


BUILDERS: dict[str, Callable[[Message, Settings], Built]] = {
    "email": _email,
    "slack": _slack,
    "teams": _teams,
    "sms": _sms,
    "push": _push,
    "in_app": _in_app,
    "webhook": _webhook,
    "console": _console,
}
"""The request builder of each channel; `generic` (the rendered fields) for any other."""


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
