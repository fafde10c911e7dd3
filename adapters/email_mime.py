"""The email both transports send (SMTP and SendGrid), built by pure functions from a Message.

- `Message-ID: <clm_{40 hex}@{domain of the From identity}>`: an HMAC-SHA256, under a key derived
  from CLARION_WEBHOOK_SECRET, of the idempotency key and the delivery id. The same for every attempt
  at one delivery, so a repeat after an unknown outcome carries the id of the first (Gmail and most
  mail clients thread or fold two messages with one Message-ID; no provider dedups on it). Another
  deployment (another secret) gives other ids for the same key, nobody without the secret can
  predict one, and an occurrence key reused after retention (a new request, a new delivery row)
  gets a new id, so clients do not fold the new message into the old thread.
- Two sending identities: transactional and security mail from CLARION_EMAIL_FROM; every other
  category, and anything sent in the activation lane, from CLARION_EMAIL_FROM_MARKETING (default:
  the same). Separate identities keep a marketing reputation problem off password resets.
- Subject from content["title"] (else the body's first line), with control characters and line
  breaks turned into spaces: no header injection from template variables.
- A text/plain part and a text/html part. The HTML is the body escaped (adapters.escape.html) in a
  fixed frame, paragraphs and line breaks kept: no markup, link or image can come from variables.
- Non-transactional categories carry `List-Unsubscribe: <{public_url}/webhooks/email/unsubscribe
  ?t=TOKEN>` and `List-Unsubscribe-Post: List-Unsubscribe=One-Click` (RFC 8058). TOKEN names the
  user and the delivery with an HMAC (CLARION_WEBHOOK_SECRET) that web/email.py checks first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import datetime
from email import policy
from email.message import EmailMessage
from email.utils import format_datetime, formataddr, parseaddr

from clarion.adapters.escape import html, plain_text
from clarion.errors import PermanentSendError
from clarion.records import Message

# Mirrors gates.preferences.LOCKED_CATEGORIES (adapters import nothing from gates/): mail a
# recipient cannot opt out of, so it has no unsubscribe link and uses the transactional identity.
TRANSACTIONAL = frozenset({"transactional", "security"})
UNSUBSCRIBE_PATH = "/webhooks/email/unsubscribe"
ONE_CLICK = "List-Unsubscribe=One-Click"
MAX_SUBJECT = 200  # characters; long subjects are cut, not refused
_TOKEN_CONTEXT = b"clarion-email-unsubscribe:v1\x1f"
_MAC_BYTES = 16
_BREAKS = re.compile(r"\s*[\r\n\u2028\u2029]+\s*")
_PARAGRAPHS = re.compile(r"(?:\r\n|\r|\n)[ \t]*(?:\r\n|\r|\n)\s*")
_LINES = re.compile(r"\r\n|\r|\n")
# Headers fold only past RFC 5322's hard limit: a List-Unsubscribe URL has no whitespace to fold
# at, and the default (78) would turn it into RFC 2047 encoded words no client follows.
WIRE = policy.SMTP.clone(max_line_length=998)
WIRE_UTF8 = policy.SMTPUTF8.clone(max_line_length=998)


@dataclass(frozen=True)
class Identities:
    """The From identities of the two lanes (CLARION_EMAIL_FROM, CLARION_EMAIL_FROM_MARKETING)."""

    transactional: str
    marketing: str | None = None

    def for_message(self, message: Message) -> str:
        if is_transactional(message):
            return self.transactional
        return self.marketing or self.transactional


@dataclass(frozen=True)
class Email:
    """One email, transport-neutral: what SMTP renders as MIME and SendGrid as its JSON."""

    sender: str  # "Name <addr@domain>"
    to: str
    subject: str
    text: str
    html: str
    headers: tuple[tuple[str, str], ...]  # Message-ID, List-Unsubscribe…, in order
    message_id: str  # "<clm_…@domain>"
    transactional: bool

    @property
    def sender_address(self) -> str:
        return parseaddr(self.sender)[1]

    @property
    def sender_name(self) -> str:
        return parseaddr(self.sender)[0]


def is_transactional(message: Message) -> bool:
    """Transactional identity: a locked category, and not sent in the activation lane."""
    return message.category in TRANSACTIONAL and message.lane != "activation"


def domain_of(sender: str) -> str:
    address = parseaddr(sender)[1]
    domain = address.rpartition("@")[2]
    if not address or "@" not in address or not domain:
        raise PermanentSendError("bad_sender", f"not a From address: {sender!r}")
    return domain.lower()


MESSAGE_ID_LABEL = b"clarion message-id key v1"


def message_id(message: Message, sender: str, secret: str) -> str:
    """The same for every attempt at one delivery; another for another deployment's `secret` or
    for a new delivery of a reused key. The key is derived from `secret` (never that secret itself,
    so a Message-ID is never a webhook signature)."""
    key = hmac.new(secret.encode(), MESSAGE_ID_LABEL, hashlib.sha256).digest()
    raw = f"{message.idempotency_key}\x1f{message.delivery_id}".encode()
    digest = hmac.new(key, raw, hashlib.sha256).hexdigest()[:40]
    return f"<clm_{digest}@{domain_of(sender)}>"


def subject_of(message: Message) -> str:
    """One line, no control characters: a template variable cannot add a header."""
    raw = message.content.get("title") or _first_line(message.content.get("body", ""))
    line = plain_text(_BREAKS.sub(" ", raw)).replace("\t", " ").strip()
    return line[:MAX_SUBJECT] or message.type_key


def _first_line(text: str) -> str:
    return next((line for line in _LINES.split(text) if line.strip()), "")


def text_part(message: Message) -> str:
    return plain_text(message.content.get("body", "")).strip() + "\n"


def html_part(message: Message, subject: str) -> str:
    """The body escaped into a fixed frame: paragraphs become <p>, line breaks <br>."""
    body = plain_text(message.content.get("body", "")).strip()
    paragraphs = [
        "<br>\n".join(html(line) for line in _LINES.split(p)) for p in _PARAGRAPHS.split(body) if p
    ]
    inner = "\n".join(f"<p>{p}</p>" for p in paragraphs)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html(subject)}</title></head>\n<body>\n{inner}\n</body></html>\n"
    )


def unsubscribe_url(public_url: str, secret: str, message: Message) -> str:
    token = unsubscribe_token(secret, message.user_id, message.delivery_id)
    return f"{public_url.rstrip('/')}{UNSUBSCRIBE_PATH}?t={token}"


def build(message: Message, *, identities: Identities, public_url: str, secret: str) -> Email:
    """The email for one message; PermanentSendError if it can never be sent (no address)."""
    if not message.address:
        raise PermanentSendError("no_address", "the recipient has no email address")
    sender = identities.for_message(message)
    mid = message_id(message, sender, secret)
    subject = subject_of(message)
    headers: list[tuple[str, str]] = [("Message-ID", mid)]
    transactional = message.category in TRANSACTIONAL
    if not transactional:
        headers += [
            ("List-Unsubscribe", f"<{unsubscribe_url(public_url, secret, message)}>"),
            ("List-Unsubscribe-Post", ONE_CLICK),
        ]
    return Email(
        sender=sender,
        to=message.address,
        subject=subject,
        text=text_part(message),
        html=html_part(message, subject),
        headers=tuple(headers),
        message_id=mid,
        transactional=transactional,
    )


def to_mime(email: Email, *, now: datetime) -> EmailMessage:
    """The email as a MIME message: multipart/alternative, text first, then HTML (RFC 2046)."""
    mime = EmailMessage()
    name, address = parseaddr(email.sender)
    mime["From"] = formataddr((name, address))
    mime["To"] = email.to
    mime["Subject"] = email.subject
    mime["Date"] = format_datetime(now)
    for header, value in email.headers:
        mime[header] = value
    mime.set_content(email.text, subtype="plain", charset="utf-8")
    mime.add_alternative(email.html, subtype="html", charset="utf-8")
    return mime


def to_bytes(email: Email, *, now: datetime) -> bytes:
    """The message as it goes on the wire: CRLF lines; SMTPUTF8 when an address needs it."""
    utf8 = not (email.sender_address.isascii() and email.to.isascii())
    return to_mime(email, now=now).as_bytes(policy=WIRE_UTF8 if utf8 else WIRE)


# --- the one-click token ----------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), _TOKEN_CONTEXT + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def unsubscribe_token(secret: str, user_id: str, delivery_id: int) -> str:
    """`<payload>.<mac>`, both base64url: the delivery and user it unsubscribes, and their HMAC."""
    payload = f"{delivery_id}\x1f{user_id}".encode()
    return f"{_b64(payload)}.{_b64(_mac(secret, payload))}"


def read_unsubscribe_token(secret: str, token: str) -> tuple[str, int] | None:
    """(user_id, delivery_id) of a token this secret signed; None for anything else."""
    if not isinstance(token, str) or len(token) > 1024 or token.count(".") != 1:
        return None
    encoded, _, mac = token.partition(".")
    try:
        payload, given = _unb64(encoded), _unb64(mac)
    except ValueError:
        return None
    if not hmac.compare_digest(_mac(secret, payload), given):
        return None
    delivery, sep, user = payload.decode("utf-8", "replace").partition("\x1f")
    if not (sep and delivery.isascii() and delivery.isdigit() and user):
        return None
    return user, int(delivery)
