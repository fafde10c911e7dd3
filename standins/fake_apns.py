"""A local APNs: a real HTTP/2 server (the `h2` library on asyncio, TLS with ALPN `h2` only), for
tests and development without Apple.

`with FakeApns() as apns:` serves https://127.0.0.1:<port> with a certificate from a CA it made
at start-up (`apns.ca_file`: point CLARION_APNS_CA_FILE at it, CLARION_APNS_URL at `apns.url`).
It also made the team's token-signing key: `apns.write_key(path)` writes the .p8 for
CLARION_APNS_KEY; `apns.KEY_ID`, `apns.TEAM_ID` and `apns.topic` are the other settings.

Like Apple, it speaks nothing but HTTP/2: a TLS client that does not offer `h2` in ALPN is
disconnected (every accepted connection's ALPN is kept in `connections`). Each POST /3/device/<token>
is checked as APNs checks it: the provider token (`authorization: bearer <JWT>`, ES256 signed by
the team key, `kid` the key id, `iss` the team id, `iat` no older than an hour: 403
InvalidProviderToken / ExpiredProviderToken / MissingProviderToken), `apns-topic`, `apns-push-type`,
`apns-priority`, `apns-collapse-id` (64 bytes), `apns-id` (a UUID, echoed), a payload of at most
4096 bytes. Accepted notifications are kept with their headers (`notifications`, `for_device`).

Faults on demand: `unregister(token)` (410 Unregistered from then on), `fail(reason, status,
token=None, times=1)` (400 BadDeviceToken, 429 TooManyRequests, 503 ServiceUnavailable, …), and
`losses.next("drop" | "late" | "5xx")`: the notification is recorded, then the connection is cut,
the answer comes late, or a 500 is sent instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import re
import shutil
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from clarion.standins.local_server import AnswerLoss

TOKEN_MAX_AGE = 3600.0
DEVICE = re.compile(r"[0-9a-fA-F]{64,200}")
PUSH_TYPES = frozenset(
    {
        "alert",
        "background",
        "location",
        "voip",
        "complication",
        "fileprovider",
        "mdm",
        "liveactivity",
    }
)


@dataclass(frozen=True)
class Notification:
    """One notification APNs accepted: device token, headers (no authorization), payload."""

    token: str
    headers: dict[str, str]
    payload: dict[str, Any]
    apns_id: str
    alpn: str  # the connection's ALPN protocol: "h2"
    stream_id: int
    connection: int  # which accepted connection carried it (0, 1, …)


@dataclass
class Failure:
    reason: str
    status: int
    token: str | None
    times: int


@dataclass
class Counts:
    requests: int = 0  # every request that reached the handler
    answers: dict[int, int] = field(default_factory=dict)  # status -> count
    provider_tokens: set[str] = field(default_factory=set)  # distinct JWTs seen


class FakeApns:
    KEY_ID = "CLARIONK01"
    TEAM_ID = "CLARIONT01"
    TOPIC = "com.example.clarion"

    def __init__(self, now: Callable[[], float] = time.time, topic: str = TOPIC) -> None:
        self.now = now
        self.topic = topic
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._dir = Path(tempfile.mkdtemp(prefix="fake-apns-"))
        self.ca_file, self._tls = _certificates(self._dir)
        self.notifications: list[Notification] = []
        self.connections: list[str | None] = []  # the ALPN protocol of each TLS connection
        self.unregistered: dict[str, int] = {}  # token -> ms timestamp
        self.failures: list[Failure] = []
        self.attempts: dict[str, int] = {}  # token -> requests with a valid provider token
        self.counts = Counts()
        self.losses = AnswerLoss()
        self.lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[_H2Protocol] = set()
        self._answers: set[asyncio.Task[None]] = set()  # answers being written (a late one sleeps)
        self.port = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._server = await self._loop.create_server(
            lambda: _H2Protocol(self), "127.0.0.1", 0, ssl=self._tls
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            for protocol in list(self._open):
                protocol.transport.abort()
            if self._server is not None:
                self._server.close()
            for task in self._answers:  # a late answer still asleep: ended, not left pending
                task.cancel()
            await asyncio.gather(*self._answers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # --- control and inspection --------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def write_key(self, path: Path) -> Path:
        """The team's token-signing key as Apple hands it out (a PKCS#8 .p8)."""
        path.write_bytes(
            self._key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return path

    def unregister(self, token: str) -> None:
        with self.lock:
            self.unregistered[token.lower()] = int(self.now() * 1000)

    def fail(self, reason: str, status: int, *, token: str | None = None, times: int = 1) -> None:
        """Answer the next `times` well-formed requests (for `token`, or any) with this error."""
        with self.lock:
            self.failures.append(Failure(reason, status, token and token.lower(), times))

    def for_device(self, token: str) -> list[Notification]:
        with self.lock:
            return [n for n in self.notifications if n.token == token.lower()]

    def per_device(self) -> dict[str, int]:
        with self.lock:
            counts: dict[str, int] = {}
            for n in self.notifications:
                counts[n.token] = counts.get(n.token, 0) + 1
            return counts

    # --- the API -----------------------------------------------------------------------------

    def answer(
        self, headers: dict[str, str], body: bytes, alpn: str, stream_id: int, connection: int
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request; records an accepted notification."""
        with self.lock:
            self.counts.requests += 1
            status, extra, answer = self._answer(headers, body, alpn, stream_id, connection)
            self.counts.answers[status] = self.counts.answers.get(status, 0) + 1
        return status, extra, answer

    def _answer(
        self, headers: dict[str, str], body: bytes, alpn: str, stream_id: int, connection: int
    ) -> tuple[int, dict[str, str], bytes]:
        path = headers.get(":path", "")
        if headers.get(":method") != "POST":
            return _refuse(405, "MethodNotAllowed")
        if not path.startswith("/3/device/"):
            return _refuse(404, "BadPath")
        refused = self._check_provider_token(headers.get("authorization", ""))
        if refused is not None:
            return _refuse(403, refused)
        token = path.removeprefix("/3/device/").lower()
        self.attempts[token] = self.attempts.get(token, 0) + 1
        problem = self._check_request(token, headers, body)
        if problem is not None:
            return _refuse(*problem)
        failure = self._failure(token)
        if failure is not None:
            return _refuse(failure.status, failure.reason)
        if token in self.unregistered:
            return _refuse(410, "Unregistered", timestamp=self.unregistered[token])
        ident = headers.get("apns-id") or str(uuid.uuid4())
        shown = {k: v for k, v in headers.items() if k != "authorization"}
        payload = json.loads(body)
        self.notifications.append(
            Notification(token, shown, payload, ident, alpn, stream_id, connection)
        )
        return 200, {"apns-id": ident}, b""

    def _check_provider_token(self, authorization: str) -> str | None:
        """None if the bearer is a fresh provider token signed by the team's key, else the reason."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return "MissingProviderToken"
        self.counts.provider_tokens.add(token)
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(
                token,
                self._key.public_key(),
                algorithms=["ES256"],
                issuer=self.TEAM_ID,
                options={"require": ["iat", "iss"], "verify_iat": False},
            )
        except jwt.PyJWTError:
            return "InvalidProviderToken"
        if header.get("kid") != self.KEY_ID or not isinstance(claims["iat"], int):
            return "InvalidProviderToken"
        age = self.now() - claims["iat"]
        if age > TOKEN_MAX_AGE:
            return "ExpiredProviderToken"
        return "InvalidProviderToken" if age < -60 else None

    def _check_request(
        self, token: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str] | None:
        if not DEVICE.fullmatch(token):
            return 400, "BadDeviceToken"
        topic = headers.get("apns-topic")
        if not topic:
            return 400, "MissingTopic"
        if topic != self.topic:
            return 400, "TopicDisallowed"
        if headers.get("apns-push-type", "alert") not in PUSH_TYPES:
            return 400, "InvalidPushType"
        if headers.get("apns-priority", "10") not in ("1", "5", "10"):
            return 400, "BadPriority"
        if len(headers.get("apns-collapse-id", "").encode()) > 64:
            return 400, "BadCollapseId"
        if "apns-id" in headers and not _is_uuid(headers["apns-id"]):
            return 400, "BadMessageId"
        if not body:
            return 400, "PayloadEmpty"
        if len(body) > 4096:
            return 413, "PayloadTooLarge"
        try:
            payload = json.loads(body)
        except ValueError:
            return 400, "BadPayload"
        return None if isinstance(payload, dict) and "aps" in payload else (400, "BadPayload")

    def _failure(self, token: str) -> Failure | None:
        for i, failure in enumerate(self.failures):
            if failure.token in (None, token):
                failure.times -= 1
                if failure.times <= 0:
                    del self.failures[i]
                return failure
        return None


def _refuse(status: int, reason: str, **extra: Any) -> tuple[int, dict[str, str], bytes]:
    return (
        status,
        {"content-type": "application/json"},
        json.dumps({"reason": reason, **extra}).encode(),
    )


def _is_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


class _H2Protocol(asyncio.Protocol):
    """One client connection: TLS with ALPN h2, then HTTP/2 frames through h2's state machine."""

    def __init__(self, fake: FakeApns) -> None:
        self.fake = fake
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.streams: dict[int, tuple[dict[str, str], bytearray]] = {}
        self.alpn = ""
        self.index = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        with self.fake.lock:
            self.index = len(self.fake.connections)
            self.fake.connections.append(alpn)
        if alpn != "h2":  # APNs speaks HTTP/2 only
            transport.close()
            return
        self.alpn = alpn
        self.fake._open.add(self)
        self.conn.initiate_connection()
        transport.write(self.conn.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self.fake._open.discard(self)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.transport.write(self.conn.data_to_send())
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                headers = {str(k): str(v) for k, v in event.headers or []}
                self.streams[event.stream_id] = (headers, bytearray())
            elif isinstance(event, h2.events.DataReceived):
                if event.stream_id in self.streams:
                    self.streams[event.stream_id][1].extend(event.data or b"")
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id in self.streams:
                task = asyncio.ensure_future(self.respond(event.stream_id))
                self.fake._answers.add(task)
                task.add_done_callback(self.fake._answers.discard)
            elif isinstance(event, h2.events.StreamReset):
                self.streams.pop(event.stream_id, None)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.transport.close()
        self.transport.write(self.conn.data_to_send())

    async def respond(self, stream_id: int) -> None:
        headers, body = self.streams.pop(stream_id)
        status, extra, answer = self.fake.answer(
            headers, bytes(body), self.alpn, stream_id, self.index
        )
        if status == 200:
            taken = self.fake.losses._take(headers.get(":path", ""))
            if taken is not None:
                mode, delay = taken
                if mode == "drop":  # accepted, and the connection is cut before the answer
                    self.transport.abort()
                    return
                if mode == "late":
                    await asyncio.sleep(delay)
                else:
                    status, extra, answer = _refuse(500, "InternalServerError")
        if self.transport.is_closing():
            return
        try:
            self.conn.send_headers(
                stream_id,
                [(":status", str(status)), *extra.items()],
                end_stream=not answer,
            )
            if answer:
                self.conn.send_data(stream_id, answer, end_stream=True)
        except h2.exceptions.H2Error:  # the client gave up on the stream (a timeout)
            return
        self.transport.write(self.conn.data_to_send())


def _certificates(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it; (CA file, server TLS
    context offering only h2)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "clarion fake APNs CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = folder / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file, key_file = folder / "server.pem", folder / "server.key"
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["h2"])
    return ca_file, context
