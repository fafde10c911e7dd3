"""A local SMTP relay (aiosmtpd in a background thread): the wire a provider's SMTP relay speaks,
for tests and the demo (no internet).

    with FakeSmtp() as relay:          # relay.url is smtp://127.0.0.1:<port>
        relay.reject("gone@example.com")              # RCPT answered 550 5.1.1
        relay.fail("rcpt", "451 4.3.0 try again")     # the next RCPT answered 451
        relay.lose("drop")                            # take the next message, then drop the line
        ...
        relay.messages                                # what it took, with envelope and parsed MIME

Every message whose data ended is kept in `messages`, including those whose answer was lost on
purpose (`answered=False`): a lost answer is exactly "the relay has it, the client does not know".
`lose("drop")` closes the connection instead of answering the end of data; `lose("late", delay=…)`
answers only after `delay` seconds (past the client's timeout). `auth=(user, password)` requires
AUTH (PLAIN/LOGIN, allowed without TLS: it is local); `tls=` serves STARTTLS or, with
`implicit_tls=True`, TLS from the first byte (smtps); `self_signed(folder)` makes one.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import logging
import socket
import ssl
import threading
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from ipaddress import ip_address
from pathlib import Path
from typing import Any, Self

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

STAGES = ("mail", "rcpt", "data")  # "data": the answer to the end of the data
USER_UNKNOWN = "550 5.1.1 <{address}>: Recipient address rejected: User unknown"


@dataclass(frozen=True)
class Received:
    """One message the relay took: the envelope as given, the raw data and its parsed form."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes
    answered: bool  # False: the relay took it and lost its answer on purpose
    arrived: float = field(default_factory=time.monotonic)  # when it was taken (budgets)

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.data, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed


@dataclass
class _Script:
    replies: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in STAGES})
    rejected: dict[str, str] = field(default_factory=dict)
    losses: list[tuple[str, float]] = field(default_factory=list)


class _Handler:
    """aiosmtpd's hooks, answering from the fake's script."""

    def __init__(self, fake: FakeSmtp) -> None:
        self.fake = fake

    async def handle_MAIL(  # noqa: N802 - the aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list
    ) -> str:
        scripted = self.fake._scripted("mail")
        if scripted:
            return scripted
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(  # noqa: N802 - the aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list
    ) -> str:
        with self.fake._lock:
            self.fake.rcpts.append(address)  # every RCPT TO asked for, refused or taken
        scripted = self.fake._scripted("rcpt") or self.fake._rejection(address)
        if scripted:
            return scripted
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(  # noqa: N802 - the aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        scripted = self.fake._scripted("data")
        if scripted:
            return scripted
        loss = self.fake._loss()
        content = envelope.original_content or envelope.content or b""
        data = content if isinstance(content, bytes) else content.encode()
        self.fake._took(
            Received(str(envelope.mail_from), tuple(envelope.rcpt_tos), data, loss is None)
        )
        if loss is not None:
            mode, delay = loss
            if mode == "late":
                await asyncio.sleep(delay)
            elif server.transport is not None:
                server.transport.close()  # no reply: the connection just ends
                await asyncio.sleep(0)
        return "250 2.0.0 Ok: queued"


class _Controller(Controller):
    """aiosmtpd's Controller on a socket bound beforehand: a free port with no race for it."""

    def __init__(self, handler: Any, sock: socket.socket, **kwargs: Any) -> None:
        self._sock = sock
        super().__init__(handler, hostname="127.0.0.1", port=sock.getsockname()[1], **kwargs)

    def factory(self) -> SMTP:
        with warnings.catch_warnings():  # "AUTH without TLS": deliberate, the relay is local
            warnings.simplefilter("ignore", UserWarning)
            return super().factory()

    def _create_server(self) -> Any:
        return self.loop.create_server(self._factory_invoker, sock=self._sock, ssl=self.ssl_context)


class FakeSmtp:
    """See the module docstring."""

    def __init__(
        self,
        *,
        auth: tuple[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
        implicit_tls: bool = False,
    ) -> None:
        self.auth = auth
        self.messages: list[Received] = []
        self.logins: list[str] = []
        self._script = _Script()
        self._lock = threading.Lock()
        self.rcpts: list[str] = []
        kwargs: dict[str, Any] = {"auth_require_tls": False, "enable_SMTPUTF8": True}
        if auth is not None:
            kwargs.update(authenticator=self._authenticate, auth_required=True)
            # aiosmtpd warns on its own logger at every AUTH (a deprecation inside aiosmtpd)
            logging.getLogger("mail.log").setLevel(logging.ERROR)
        if tls is not None and implicit_tls:
            kwargs["ssl_context"] = tls
        elif tls is not None:
            kwargs.update(tls_context=tls, require_starttls=True)
        self.scheme = "smtps" if implicit_tls else "smtp+starttls" if tls else "smtp"
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.controller = _Controller(_Handler(self), self._sock, **kwargs)

    @property
    def port(self) -> int:
        return int(self.controller.port)

    @property
    def url(self) -> str:
        """CLARION_SMTP_URL for this relay (with its credentials, if it asks for them)."""
        user = f"{self.auth[0]}:{self.auth[1]}@" if self.auth else ""
        return f"{self.scheme}://{user}127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()

    # --- the script ------------------------------------------------------------------------------

    def reject(self, address: str, reply: str | None = None) -> None:
        """Answer every RCPT TO this address with `reply` (default: 550 5.1.1 user unknown)."""
        with self._lock:
            self._script.rejected[address.lower()] = reply or USER_UNKNOWN.format(address=address)

    def fail(self, stage: str, reply: str, *, times: int = 1) -> None:
        """Answer the next `times` commands of `stage` (mail, rcpt, data) with `reply`."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        with self._lock:
            self._script.replies[stage].extend([reply] * times)

    def lose(self, mode: str = "drop", *, times: int = 1, delay: float = 2.0) -> None:
        """Take the next `times` messages, then lose the answer: `drop` or `late`."""
        if mode not in ("drop", "late"):
            raise ValueError(f"unknown loss mode {mode!r}; modes: drop, late")
        with self._lock:
            self._script.losses.extend([(mode, delay)] * times)

    def received(self, address: str | None = None) -> list[Received]:
        with self._lock:
            return [m for m in self.messages if address is None or address in m.rcpt_tos]

    @property
    def lost(self) -> int:
        """Messages taken whose answer was lost on purpose."""
        with self._lock:
            return sum(not m.answered for m in self.messages)

    # --- used by the handler (on the server's thread) ---------------------------------------------

    def _scripted(self, stage: str) -> str | None:
        with self._lock:
            queue = self._script.replies[stage]
            return queue.pop(0) if queue else None

    def _rejection(self, address: str) -> str | None:
        with self._lock:
            return self._script.rejected.get(address.lower())

    def _loss(self) -> tuple[str, float] | None:
        with self._lock:
            return self._script.losses.pop(0) if self._script.losses else None

    def _took(self, received: Received) -> None:
        with self._lock:
            self.messages.append(received)

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = (
            isinstance(data, LoginPassword)
            and self.auth is not None
            and (data.login.decode(), data.password.decode()) == self.auth
        )
        if ok:
            with self._lock:
                self.logins.append(data.login.decode())
        return AuthResult(success=ok, handled=False)  # aiosmtpd answers 235 or 535


def self_signed(folder: Path, host: str = "127.0.0.1") -> tuple[ssl.SSLContext, Path]:
    """A server TLS context for `host` with a fresh self-signed certificate, and the certificate's
    path (for clients: CLARION_SMTP_URL=...?cafile=<path>)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip_address(host))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "relay.pem", folder / "relay.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, cert_path
