"""A local FCM HTTP v1: Google's OAuth2 token endpoint and `messages:send`, as the real
google-auth and any HTTP client speak them (no internet).

`FakeFcm()` makes a service account of its own (an RSA key pair); `write_service_account(path)`
writes the JSON Firebase would give you, with `token_uri` pointing here, for
CLARION_FCM_SERVICE_ACCOUNT. Point CLARION_FCM_API_URL at `fake.url`.

- POST /token: the JWT-bearer grant. The assertion's RS256 signature is checked against the
  service account's public key, and its `iss`, `aud` (Google's token endpoint), `scope` and
  expiry; a good one gets an access token (an hour), a bad one 400 invalid_grant.
- POST /v1/projects/<id>/messages:send: needs `Authorization: Bearer <issued token>` (401
  UNAUTHENTICATED otherwise) and the account's project (403 PERMISSION_DENIED); records the
  message under its token and answers {"name": "projects/<id>/messages/<n>"}.

`shown(token)` is what the device would show: a message with the same notification tag (else
collapse key) as one shown replaces it, as Android does.

Faults on demand: `unregister(token)` (404 UNREGISTERED from then on), `fail(kind, token=None,
times=1)` with kind `INVALID_ARGUMENT` (400 naming message.token), `QUOTA_EXCEEDED` (429 +
Retry-After) or `UNAVAILABLE` (503), and `losses.next("drop" | "late" | "5xx",
match="messages:send")`: the message is recorded, then its answer is lost.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from clarion.standins.local_server import AnswerLoss, LocalServer, send_json

GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
FAULTS = {
    "INVALID_ARGUMENT": (
        400,
        "INVALID_ARGUMENT",
        "The registration token is not a valid FCM registration token",
    ),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED", "Message rate exceeded"),
    "UNAVAILABLE": (503, "UNAVAILABLE", "The service is currently unavailable."),
}


@dataclass
class Fault:
    kind: str
    token: str | None
    times: int
    retry_after: int


@dataclass
class Sent:
    """One accepted message: its token, the whole `message` object and the answer's name."""

    token: str
    message: dict[str, Any]
    name: str


@dataclass
class Counts:
    token_requests: int = 0
    tokens_refused: int = 0
    sends: int = 0  # every messages:send that got past authentication
    unauthenticated: int = 0
    answers: dict[int, int] = field(default_factory=dict)  # status -> count


class FakeFcm(LocalServer):
    PROJECT = "clarion-test"
    CLIENT_EMAIL = "clarion@clarion-test.iam.gserviceaccount.com"

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.key_id = secrets.token_hex(8)
        self.access_tokens: dict[str, float] = {}  # issued token -> expiry
        self.sent: list[Sent] = []
        self.attempts: dict[str, int] = {}  # token -> sends that reached it, answered or not
        self.unregistered: set[str] = set()
        self.faults: list[Fault] = []
        self.counts = Counts()
        self.losses = AnswerLoss()
        self._ids = itertools.count(1)
        self.lock = threading.Lock()
        super().__init__(self._handler())

    # --- control and inspection --------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.base_url

    def service_account(self) -> dict[str, str]:
        pem = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        return {
            "type": "service_account",
            "project_id": self.PROJECT,
            "private_key_id": self.key_id,
            "private_key": pem,
            "client_email": self.CLIENT_EMAIL,
            "client_id": "1000000000000000000",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": f"{self.url}/token",
            "universe_domain": "googleapis.com",
        }

    def write_service_account(self, path: Path) -> Path:
        path.write_text(json.dumps(self.service_account()))
        return path

    def unregister(self, token: str) -> None:
        with self.lock:
            self.unregistered.add(token)

    def fail(
        self, kind: str, *, token: str | None = None, times: int = 1, retry_after: int = 30
    ) -> None:
        """Answer the next `times` sends (to `token`, or any) with this error."""
        if kind not in FAULTS:
            raise ValueError(f"unknown FCM fault {kind!r}; faults: {', '.join(FAULTS)}")
        with self.lock:
            self.faults.append(Fault(kind, token, times, retry_after))

    def messages(self, token: str) -> list[dict[str, Any]]:
        """The messages accepted for one device token, oldest first."""
        with self.lock:
            return [s.message for s in self.sent if s.token == token]

    def shown(self, token: str) -> list[dict[str, Any]]:
        """What the device shows, as Android does: a message whose `android.notification.tag`
        (else `android.collapse_key`) is already shown replaces that one in place; others stack."""
        tray: dict[object, dict[str, Any]] = {}
        for i, message in enumerate(self.messages(token)):
            android = message.get("android") or {}
            key = (android.get("notification") or {}).get("tag") or android.get("collapse_key")
            tray.pop(key or i, None)  # replaced: the newer one goes where the newest goes
            tray[key or i] = message
        return list(tray.values())

    def per_token(self) -> dict[str, int]:
        with self.lock:
            counts: dict[str, int] = {}
            for s in self.sent:
                counts[s.token] = counts.get(s.token, 0) + 1
            return counts

    # --- the API -----------------------------------------------------------------------------

    def grant(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """The token endpoint: check the JWT-bearer assertion, issue an access token."""
        with self.lock:
            self.counts.token_requests += 1
            if form.get("grant_type") != JWT_BEARER:
                self.counts.tokens_refused += 1
                return 400, {"error": "unsupported_grant_type"}
            try:
                claims = jwt.decode(
                    form.get("assertion", ""),
                    self._key.public_key(),
                    algorithms=["RS256"],
                    audience=GOOGLE_TOKEN_AUDIENCE,
                    issuer=self.CLIENT_EMAIL,
                    options={"require": ["iat", "exp", "iss", "aud"]},
                )
                header = jwt.get_unverified_header(form.get("assertion", ""))
            except jwt.PyJWTError as exc:
                self.counts.tokens_refused += 1
                return 400, {"error": "invalid_grant", "error_description": str(exc)}
            if (
                SCOPE not in str(claims.get("scope", "")).split()
                or header.get("kid") != self.key_id
            ):
                self.counts.tokens_refused += 1
                return 400, {"error": "invalid_scope"}
            token = "ya29." + secrets.token_urlsafe(24)
            self.access_tokens[token] = self.now() + 3600
            return 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}

    def deliver(
        self, project: str, bearer: str | None, body: dict[str, Any]
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        """messages:send: (status, headers, answer). Records what it accepts."""
        with self.lock:
            expiry = self.access_tokens.get(bearer or "")
            if expiry is None or expiry < self.now():
                self.counts.unauthenticated += 1
                return 401, {}, _error(401, "UNAUTHENTICATED", "Request had invalid credentials.")
            if project != self.PROJECT:
                return 403, {}, _error(403, "PERMISSION_DENIED", f"no access to {project}")
            self.counts.sends += 1
            message = body.get("message") if isinstance(body, dict) else None
            token = message.get("token") if isinstance(message, dict) else None
            if not isinstance(token, str) or not token:
                return 400, {}, _error(400, "INVALID_ARGUMENT", "message.token is required")
            self.attempts[token] = self.attempts.get(token, 0) + 1
            fault = self._fault(token)
            if fault is not None:
                status, code, text = FAULTS[fault.kind]
                headers = {"Retry-After": str(fault.retry_after)} if status == 429 else {}
                answer = _error(status, code, text, fcm_code=fault.kind)
                if fault.kind == "INVALID_ARGUMENT":
                    answer["error"]["details"].append(
                        {
                            "@type": "type.googleapis.com/google.rpc.BadRequest",
                            "fieldViolations": [
                                {
                                    "field": "message.token",
                                    "description": "Invalid registration token",
                                }
                            ],
                        }
                    )
                return status, headers, answer
            if token in self.unregistered:
                return (
                    404,
                    {},
                    _error(
                        404, "NOT_FOUND", "Requested entity was not found.", fcm_code="UNREGISTERED"
                    ),
                )
            name = f"projects/{project}/messages/0:{next(self._ids)}"
            self.sent.append(Sent(token, message, name))  # type: ignore[arg-type]
            return 200, {}, {"name": name}

    def _fault(self, token: str) -> Fault | None:
        for i, fault in enumerate(self.faults):
            if fault.token in (None, token):
                fault.times -= 1
                if fault.times <= 0:
                    del self.faults[i]
                return fault
        return None

    # --- HTTP --------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.partition("?")[0]
                if path == "/token":
                    status, answer = fake.grant(dict(parse_qsl(body.decode(errors="replace"))))
                    send_json(self, status, answer)
                    return
                parts = path.strip("/").split("/")
                if (
                    len(parts) != 4
                    or parts[:2] != ["v1", "projects"]
                    or parts[3] != "messages:send"
                ):
                    send_json(self, 404, _error(404, "NOT_FOUND", f"no such method {path}"))
                    return
                auth = self.headers.get("Authorization", "")
                bearer = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
                try:
                    parsed = json.loads(body or b"{}")
                except ValueError:
                    send_json(self, 400, _error(400, "INVALID_ARGUMENT", "body is not JSON"))
                    return
                status, headers, answer = fake.deliver(parts[2], bearer, parsed)
                with fake.lock:
                    fake.counts.answers[status] = fake.counts.answers.get(status, 0) + 1
                if status == 200 and fake.losses.apply(self):
                    return
                send_json(self, status, answer, headers)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _error(status: int, code: str, message: str, *, fcm_code: str | None = None) -> dict[str, Any]:
    details: list[dict[str, Any]] = []
    if fcm_code:
        details.append({"@type": FCM_ERROR, "errorCode": fcm_code})
    return {"error": {"code": status, "message": message, "status": code, "details": details}}
