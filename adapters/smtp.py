"""The email channel over any provider's SMTP relay (smtplib).

CLARION_SMTP_URL: `smtp://host:25` (plain), `smtp+starttls://user:pass@host:587` (STARTTLS,
required) or `smtps://user:pass@host:465` (implicit TLS); user and password are URL-quoted;
`?cafile=/path.pem` trusts a private CA. The conversation is run one stage at a time, so that
every reply is judged by where it came:

| what happened                                                       | outcome                      |
| ------------------------------------------------------------------- | ---------------------------- |
| no connection; a 4xx at any stage; dropped before the end of data  | failed, retried (transient)  |
| 5xx at RCPT naming the address (5.1.x, 5.2.1; 550/551/553 bare)     | failed + address suppressed  |
| other 5xx (AUTH, MAIL, RCPT policy, DATA, after the data)           | failed for good              |
| the end of data was written, then a drop or a timeout              | unknown                      |

SMTP has no idempotency key (`dedups_by_key = False`): an unknown outcome is held or resent per the
type's guarantee (tasks.send.outcomes). A resend carries the same Message-ID, which lets Gmail and most
mail clients fold the repeat. Sends spend a budget per relay credential (host, port, user).
"""

from __future__ import annotations

import contextlib
import re
import smtplib
import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from clarion import clock
from clarion.adapters.base import Channel, Collaborators, Suppressions
from clarion.adapters.email_mime import Identities, build, to_bytes
from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.errors import (
    ConfigurationError,
    PermanentSendError,
    SendError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult
from clarion.settings import Settings

SCHEMES = {"smtp": 25, "smtp+starttls": 587, "smtps": 465}
_ENHANCED = re.compile(r"^\s*([245])\.(\d{1,3})\.(\d{1,3})\b")


@dataclass(frozen=True)
class Relay:
    """Where and how to reach the relay, from CLARION_SMTP_URL."""

    scheme: str
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    cafile: str | None = None

    @classmethod
    def from_url(cls, url: str) -> Relay:
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ConfigurationError(
                "CLARION_SMTP_URL must be smtp://, smtp+starttls:// or smtps://host[:port]"
            )
        try:
            port = parts.port or SCHEMES[parts.scheme]
        except ValueError as exc:
            raise ConfigurationError(f"CLARION_SMTP_URL: bad port ({exc})") from exc
        cafile = parse_qs(parts.query).get("cafile", [None])[0]
        return cls(
            parts.scheme,
            parts.hostname,
            port,
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password else None,
            cafile,
        )

    @property
    def credential(self) -> str:
        """The budget's scope: one relay account."""
        return f"{self.host}:{self.port}:{self.username or ''}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cafile)


@dataclass(frozen=True)
class SmtpRequest:
    envelope_from: str
    to: str
    data: bytes  # the message, CRLF line endings, not yet dot-stuffed
    message_id: str

    @property
    def needs_smtputf8(self) -> bool:
        """An address outside ASCII can only travel with the relay's SMTPUTF8 (RFC 6531)."""
        return not (self.envelope_from.isascii() and self.to.isascii())


@dataclass(frozen=True)
class SmtpReply:
    """Where the conversation ended: `stage` (connect, ehlo, starttls, auth, mail, rcpt, data,
    end) and the relay's reply there. A 2xx at `end` means the relay took the message."""

    stage: str
    code: int
    text: str
    message_id: str


def enhanced_status(text: str) -> tuple[int, int, int] | None:
    match = _ENHANCED.match(text)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def names_bad_address(reply: SmtpReply) -> bool:
    """A 5xx at RCPT that is about the address itself (not a relay policy such as 5.7.1): it goes
    on the suppression list. Bare codes (no enhanced status) count for 550, 551 and 553."""
    if reply.stage != "rcpt" or not 500 <= reply.code < 600:
        return False
    status = enhanced_status(reply.text)
    if status is None:
        return reply.code in (550, 551, 553)
    return status[0] == 5 and (status[1] == 1 or status[1:] == (2, 1))


def outcome(reply: SmtpReply) -> SendResult | SendError:
    """The pure judgement of where the conversation ended."""
    reason, detail = f"smtp_{reply.code}", f"{reply.stage}: {reply.code} {reply.text}"[:300]
    if reply.stage == "end" and 200 <= reply.code < 300:
        return SendResult(platform="email", provider_message_id=reply.message_id, repeat=None)
    if 400 <= reply.code < 500:
        return TransientSendError(reason, detail)
    if 500 <= reply.code < 600:
        return PermanentSendError(reason, detail)
    if reply.stage == "end":  # a garbled answer to the data: it may have been taken
        return UnknownSendError("smtp_bad_reply", detail)
    return TransientSendError(reason, detail)


def dot_stuffed(data: bytes) -> bytes:
    """The DATA payload: leading dots doubled, CRLF-terminated, then the end-of-data line."""
    data = re.sub(rb"(?m)^\.", b"..", data)
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    return data + b".\r\n"


def _reply(stage: str, code: int, text: bytes | str, mid: str) -> SmtpReply:
    shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    return SmtpReply(stage, code, " ".join(shown.split())[:300], mid)


class SmtpAdapter(Channel[SmtpRequest, SmtpReply]):
    """Email through an SMTP relay (see the module docstring)."""

    channel = "email"
    needs_address = True
    dedups_by_key = False  # SMTP has no idempotency key; the Message-ID only lets clients fold

    def __init__(
        self,
        relay: Relay,
        *,
        identities: Identities,
        public_url: str,
        secret: str,
        timeout: float,
        suppressions: Suppressions | None = None,
        limits: RateLimits | None = None,
        quota: Quota | None = None,
    ) -> None:
        self.relay = relay
        self.identities = identities
        self.public_url = public_url
        self.secret = secret
        self.timeout = timeout
        self.suppressions = suppressions
        self.limits = limits
        self.quota = quota

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> SmtpAdapter:
        return cls(
            Relay.from_url(s.smtp_url or ""),
            identities=Identities(s.email_from, s.email_from_marketing),
            public_url=s.public_url,
            secret=s.webhook_secret,
            timeout=s.email_timeout,
            suppressions=parts.suppressions,
            limits=parts.limits,
            quota=Quota("smtp", ((s.email_per_second, 1.0),)),
        )

    def to_request(self, message: Message) -> SmtpRequest:
        email = build(
            message, identities=self.identities, public_url=self.public_url, secret=self.secret
        )
        data = to_bytes(email, now=clock.now())
        return SmtpRequest(email.sender_address, email.to, data, email.message_id)

    def budget(self, message: Message, request: SmtpRequest) -> tuple[Quota, str, int] | None:
        return (self.quota, self.relay.credential, 1) if self.quota else None

    def call(self, request: SmtpRequest) -> SmtpReply:
        try:
            conn = self._connect()
        except (OSError, smtplib.SMTPException) as exc:
            code = getattr(exc, "smtp_code", 0)
            if isinstance(code, int) and code >= 400:
                return _reply("connect", code, getattr(exc, "smtp_error", b""), request.message_id)
            raise TransientSendError("smtp_connect", str(exc)[:200]) from exc
        try:
            return self._converse(conn, request)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def from_response(self, message: Message, response: SmtpReply) -> SendResult:
        result = outcome(response)
        if isinstance(result, SendResult):
            return result
        if names_bad_address(response) and self.suppressions and message.address:
            self.suppressions.suppress(
                message.user_id, "email", message.address, "bounced", result.detail
            )
        raise result

    # --- the conversation ------------------------------------------------------------------------

    def _connect(self) -> smtplib.SMTP:
        relay = self.relay
        if relay.scheme == "smtps":
            return smtplib.SMTP_SSL(
                relay.host, relay.port, timeout=self.timeout, context=relay.tls()
            )
        return smtplib.SMTP(relay.host, relay.port, timeout=self.timeout)

    def _converse(self, conn: smtplib.SMTP, request: SmtpRequest) -> SmtpReply:
        """EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA: the first reply that is not a success ends it."""
        mid = request.message_id
        try:
            code, text = conn.ehlo()
            if code != 250:
                return _reply("ehlo", code, text, mid)
            if self.relay.scheme == "smtp+starttls":
                if not conn.has_extn("starttls"):
                    raise PermanentSendError(
                        "smtp_no_starttls", "the relay does not offer STARTTLS"
                    )
                code, text = conn.starttls(context=self.relay.tls())
                if code != 220:
                    return _reply("starttls", code, text, mid)
                conn.ehlo()
            if self.relay.username:
                try:
                    conn.login(self.relay.username, self.relay.password or "")
                except smtplib.SMTPAuthenticationError as exc:
                    return _reply("auth", exc.smtp_code, exc.smtp_error, mid)
                except smtplib.SMTPNotSupportedError as exc:
                    raise PermanentSendError("smtp_no_auth", str(exc)[:200]) from exc
            options: list[str] = []
            if request.needs_smtputf8:
                if not conn.has_extn("smtputf8"):
                    raise PermanentSendError(
                        "smtp_utf8_unsupported", "a non-ASCII address, and no SMTPUTF8 at the relay"
                    )
                options = ["SMTPUTF8", "BODY=8BITMIME"]
            code, text = conn.mail(request.envelope_from, options)
            if code != 250:
                return _reply("mail", code, text, mid)
            code, text = conn.rcpt(request.to)
            if code not in (250, 251):
                return _reply("rcpt", code, text, mid)
            code, text = conn.docmd("DATA")
            if code != 354:
                return _reply("data", code, text, mid)
        except (OSError, smtplib.SMTPException) as exc:  # nothing was taken yet
            raise TransientSendError("smtp_disconnected", str(exc)[:200]) from exc
        return self._end_of_data(conn, request)

    def _end_of_data(self, conn: smtplib.SMTP, request: SmtpRequest) -> SmtpReply:
        """Write the message and its final dot; from then on, a lost reply is an unknown outcome."""
        try:
            conn.send(dot_stuffed(request.data))
        except (OSError, smtplib.SMTPException) as exc:  # the end of data never left in full
            raise TransientSendError("smtp_disconnected", str(exc)[:200]) from exc
        try:
            code, text = conn.getreply()
        except (OSError, smtplib.SMTPException) as exc:  # socket.timeout is an OSError
            raise UnknownSendError("no_answer", f"after the end of data: {exc}"[:200]) from exc
        with contextlib.suppress(OSError, smtplib.SMTPException):
            conn.quit()  # the relay answered the data; how the session ends does not matter
        return _reply("end", code, text, request.message_id)
