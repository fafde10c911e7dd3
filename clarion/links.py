"""Signed, expiring links: a token that names one user until a time, for one purpose.

    key = link_key(settings.get())
    token = sign(key, "preferences", "user-42", expires=1_800_000_000)
    verify(key, "preferences", token, now=clock.now())  # -> "user-42", or BadLink / ExpiredLink

A token is `<payload>.<mac>`, both base64url without padding: the payload is the user id and the
expiry (unix seconds), the MAC is HMAC-SHA256 over the purpose and the payload *as sent*, so the
signature is checked (in constant time) before a byte of the payload is decoded, and the expiry
right after, before anything else of the request is read. The purpose keeps a token made for one
door from opening another. Pure: the key and `now` are parameters.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from datetime import datetime, timedelta

from clarion.errors import ClarionError, InvalidRequest
from clarion.settings import Settings

MAX_TOKEN = 2048
_B64 = re.compile(r"[A-Za-z0-9_-]+")
_TTL = re.compile(r"(\d{1,7})([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_TTL = 366 * 86400.0


class BadLink(ClarionError):
    """The token was not signed with this key for this purpose (tampered, cut off, made up)."""


class ExpiredLink(ClarionError):
    """A genuine token whose time has passed."""

    def __init__(self, expired_at: datetime) -> None:
        super().__init__(f"the link expired at {expired_at.isoformat()}")
        self.expired_at = expired_at


def link_key(s: Settings) -> bytes:
    """CLARION_LINK_SECRET, else a key derived from CLARION_WEBHOOK_SECRET (never that secret
    itself: a webhook signature can then never pass as a link)."""
    if s.link_secret:
        return s.link_secret.encode()
    return hmac.new(s.webhook_secret.encode(), b"clarion link key v1", hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _mac(key: bytes, purpose: str, payload: str) -> bytes:
    return hmac.new(key, f"{purpose}\x1f{payload}".encode(), hashlib.sha256).digest()


def sign(key: bytes, purpose: str, user_id: str, expires: int) -> str:
    """A token naming `user_id` for `purpose` until `expires` (unix seconds)."""
    payload = _b64(f"{user_id}\x1f{expires}".encode())
    return f"{payload}.{_b64(_mac(key, purpose, payload))}"


def verify(key: bytes, purpose: str, token: str, *, now: datetime) -> str:
    """The user id of a token `sign(key, purpose, ...)` made, if it has not expired at `now`.
    Raises BadLink for anything else, ExpiredLink for a genuine token past its time."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN or token.count(".") != 1:
        raise BadLink("malformed link token")
    payload, _, mac = token.partition(".")
    if not (_B64.fullmatch(payload) and _B64.fullmatch(mac)):
        raise BadLink("malformed link token")
    expected = _b64(_mac(key, purpose, payload)).encode("ascii")
    if not hmac.compare_digest(expected, mac.encode("ascii")):
        raise BadLink("the link's signature does not verify")
    user_id, _, expires = _unb64(payload).rpartition("\x1f")
    if not (user_id and expires.isascii() and expires.isdigit() and len(expires) <= 12):
        raise BadLink("malformed link payload")  # only a key holder could sign this
    if now.timestamp() >= int(expires):
        raise ExpiredLink(datetime.fromtimestamp(int(expires), tz=now.tzinfo))
    return user_id


def _unb64(text: str) -> str:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadLink("malformed link payload") from exc


def form_token(key: bytes, token: str) -> str:
    """The CSRF token a page opened with `token` puts in its form (bound to that link)."""
    return _b64(_mac(key, "form", token))


def check_form_token(key: bytes, token: str, given: str) -> bool:
    """Is `given` the form token of a page opened with `token`? (Constant time.)"""
    expected = form_token(key, token).encode("ascii")
    return hmac.compare_digest(expected, given.encode("utf-8", "surrogateescape"))


def parse_ttl(value: str | float | timedelta) -> float:
    """Seconds of a lifetime: 3600, "90s", "30m", "12h", "7d", "2w" (more than 0, at most 366 days)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (found := _TTL.fullmatch(value.strip())):
        seconds = float(int(found.group(1)) * _UNITS[found.group(2)])
    else:
        raise InvalidRequest(f"ttl: expected seconds or 30m, 12h, 7d, 2w, not {str(value)[:40]!r}")
    if not 0 < seconds <= MAX_TTL:
        raise InvalidRequest(f"ttl: must be more than 0 and at most 366 days, not {seconds:g} s")
    return seconds
