"""API keys: made, checked and rate-limited here; stored by db/api_keys.py.

A key reads `clk_<prefix>_<secret>`: the prefix (12 hex digits) is public and names the key in
`clarion keys list` and in logs; the secret is 32 random bytes. Only the SHA-256 of the whole key is
stored, and it is shown once, when it is created.

Why SHA-256 and not bcrypt/scrypt/argon2: those are slow on purpose so that a stolen table of
*passwords* (a few dozen bits of entropy) cannot be guessed through. A 256-bit random secret cannot
be guessed at any hashing speed, so slowness buys nothing — while it would cost ~100 ms of CPU on
every API request, which is an easy way to take a 2-core web process down. (bcrypt also ignores
everything past 72 bytes.)

Scopes: `events:write` (POST /v1/events…), `requests:read` (GET /v1/requests/…),
`preferences:read` and `preferences:write` (/v1/users/{user_id}/preferences), `recipients:read`,
`recipients:write` (GET/PUT /v1/users/{user_id}, and an event's inline `recipient` also needs it)
and `recipients:erase` (DELETE /v1/users/{user_id}), kept apart from write; `webhooks:manage`
(/v1/webhook-endpoints: where outbound events go, and their secrets); `activity:read` (the support
staff's activity page, /activity: every recipient's history, so never an app's key). Other surfaces add
theirs to SCOPES. Per-key rate limits spend one unit per HTTP request from the shared Redis
budgets of adapters/ratelimit.py, reserved by each process in chunks (`Reserve`): a process takes
`chunk_size(key)` units from Redis at once and spends them locally, so most requests make no Redis
round trip. A chunk is at most 1/CHUNK_SHARE of the key's rate (and at most CHUNK_MAX): a key of
100 per second or less still takes one unit per request, exact as before. What this costs, per
window of the key's rate: at most `processes × chunk` requests above the rate (each process's chunk
reserved before the window and spent in it; the units are charged in Redis when reserved, so the
rest of the window holds), and as many below it (chunks reserved and not spent: they lapse one
window after they were taken). A chunk that no longer fits the budget is not taken: the request
asks for its one unit, so near the limit every process is exact again and the 429's Retry-After
is Redis's own.

A key may expire (`clarion keys create --expires 90d`): past `expires_at` it is refused with a 401
that says so. Its last use is recorded at most once a minute (`last_used_at`): the request reads the
key anyway, and writes only when the time it read is a minute old, with a conditional UPDATE so that
processes racing on one key still write once.

Keys are cached per process for KEY_CACHE_SECONDS after they are read, so a request reads no row:
a key revoked (or changed) in another process is still honoured here for at most that long
(`clarion keys revoke` says so); revoked in this process, it is refused at once. Expiry is checked
on every request against the cached `expires_at`, so it is exact. Only keys that exist are cached:
a key created elsewhere works here at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import re
import secrets
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from clarion import clock
from clarion import validation as check
from clarion.adapters.ratelimit import Quota
from clarion.db import api_keys
from clarion.db.api_keys import ApiKey
from clarion.db.engine import engine
from clarion.errors import ClarionError, InvalidRequest, ThrottledError
from clarion.links import parse_ttl
from clarion.tasks import runtime
from clarion.web.api_errors import ApiError, from_clarion

SCOPES = (
    "events:write",
    "requests:read",
    "preferences:read",
    "preferences:write",
    "recipients:read",
    "recipients:write",
    "recipients:erase",
    "escalations:write",
    "webhooks:manage",
    "topics:write",
    "broadcasts:write",
    "broadcasts:read",
    "activity:read",
)
KEY = re.compile(r"clk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
DEFAULT_RATE = (100, 1)  # requests per seconds
KEY_CACHE_SECONDS = 2.0  # how long another process may honour a key revoked elsewhere
CHUNK_SHARE = 50  # a process reserves at most 1/CHUNK_SHARE of a key's rate at once
CHUNK_MAX = 64  # and at most this many units


class KeyCache:
    """The keys this process read lately, by prefix, with the (injected) time each was read."""

    def __init__(self, seconds: float = KEY_CACHE_SECONDS) -> None:
        self.seconds = seconds
        self._keys: dict[str, tuple[ApiKey, datetime]] = {}

    def fresh(self, prefix: str, now: datetime) -> ApiKey | None:
        """The key read less than `seconds` before `now`, if any."""
        found = self._keys.get(prefix)
        if found is None or not 0 <= (now - found[1]).total_seconds() < self.seconds:
            return None
        return found[0]

    def keep(self, record: ApiKey, read_at: datetime) -> None:
        self._keys[record.prefix] = (record, read_at)

    def used(self, record: ApiKey, now: datetime) -> None:
        """The cached copy's last use is `now` (kept as long as it was read for)."""
        found = self._keys.get(record.prefix)
        self.keep(replace(record, last_used_at=now), now if found is None else found[1])

    def forget(self, prefix: str) -> None:
        self._keys.pop(prefix, None)


KEYS = KeyCache()


@dataclass(frozen=True)
class NewKey:
    """A key just created: `secret` is the only copy of the whole key there will ever be."""

    secret: str
    record: ApiKey


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def generate() -> tuple[str, str]:
    """(prefix, whole key) of a fresh key."""
    prefix = secrets.token_hex(6)
    return prefix, f"clk_{prefix}_{secrets.token_urlsafe(32)}"


def checked_scopes(scopes: Iterable[str]) -> list[str]:
    listed = sorted(set(scopes))
    unknown = [s for s in listed if s not in SCOPES]
    if not listed or unknown:
        raise InvalidRequest(
            f"unknown scope {', '.join(unknown)!s}; known: {', '.join(SCOPES)}"
            if unknown
            else f"give at least one scope: {', '.join(SCOPES)}"
        )
    return listed


def parse_rate(value: str) -> tuple[int, int]:
    """'100/s', '6000/m', '50/10s' → (amount, seconds)."""
    match = re.fullmatch(r"([1-9][0-9]{0,8})/([1-9][0-9]{0,5})?(s|m|h)", value.strip())
    if not match:
        raise InvalidRequest(f"--rate takes AMOUNT/UNIT such as 100/s, 6000/m or 50/10s: {value!r}")
    unit = {"s": 1, "m": 60, "h": 3600}[match.group(3)]
    return int(match.group(1)), int(match.group(2) or 1) * unit


def parse_expires(value: str | None) -> timedelta | None:
    """'90d', '12h', '2w' (at most 366 days) → how long a new key lives; None → for ever."""
    if value is None:
        return None
    try:
        return timedelta(seconds=parse_ttl(value))
    except InvalidRequest as exc:
        raise InvalidRequest(
            f"--expires takes 30m, 12h, 90d or 2w (at most 366 days), not {value[:40]!r}"
        ) from exc


def create_key(
    name: str,
    scopes: Iterable[str],
    rate: tuple[int, int] = DEFAULT_RATE,
    expires: timedelta | None = None,
) -> NewKey:
    """Make and store a key, valid for `expires` (None: until revoked); the returned secret is not
    stored anywhere."""
    if not name.strip() or len(name) > 200 or "\x00" in name:
        raise InvalidRequest("a key needs a name of 1 to 200 characters")
    prefix, secret = generate()
    now = clock.now()
    with engine().begin() as conn:
        record = api_keys.insert_key(
            conn,
            prefix=prefix,
            name=name,
            secret_sha256=digest(secret),
            scopes=checked_scopes(scopes),
            rate_limit=rate[0],
            rate_window=rate[1],
            now=now,
            expires_at=None if expires is None else now + expires,
        )
    return NewKey(secret, record)


def list_keys() -> list[ApiKey]:
    with engine().connect() as conn:
        return api_keys.all_keys(conn)


def revoke_key(prefix: str) -> ApiKey:
    """Revoke the key with this prefix (or the whole key); InvalidRequest if none is live."""
    match = KEY.fullmatch(prefix)
    prefix = match.group(1) if match else prefix
    with engine().begin() as conn:
        revoked = api_keys.revoke_key(conn, prefix, now=clock.now())
    KEYS.forget(prefix)
    if revoked is None:
        raise InvalidRequest(f"no live API key with prefix {prefix!r}")
    return revoked


def _unauthorized(reason: str) -> ApiError:
    return ApiError(
        401, "unauthorized", "Authorization", reason, headers={"WWW-Authenticate": "Bearer"}
    )


def _token(header: str | None) -> tuple[str, str]:
    """(prefix, whole key) of a `Bearer` header, or 401."""
    if not header:
        raise _unauthorized("send Authorization: Bearer <API key>")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    match = KEY.fullmatch(token) if scheme.lower() == "bearer" else None
    if match is None:
        raise _unauthorized("not a clarion API key (Authorization: Bearer clk_…)")
    return match.group(1), token


def _checked(record: ApiKey | None, token: str, scope: str, now: datetime) -> ApiKey:
    if record is None or not hmac.compare_digest(record.secret_sha256, digest(token)):
        raise _unauthorized("unknown API key")
    if record.revoked_at is not None:
        raise _unauthorized("this API key was revoked")
    if record.expires_at is not None and record.expires_at <= now:
        raise _unauthorized(f"this API key expired at {record.expires_at.isoformat()}")
    if scope not in record.scopes:
        raise ApiError(403, "forbidden", "Authorization", f"this API key lacks the scope {scope}")
    return record


def authenticate(header: str | None, scope: str) -> ApiKey:
    """The live key a `Bearer` header carries, holding `scope`; else 401 (no, unknown or revoked
    key) or 403 (the key lacks the scope). The hash is compared in constant time."""
    prefix, token = _token(header)
    now = clock.now()
    record = KEYS.fresh(prefix, now)
    if record is None:
        with engine().connect() as conn:
            record = api_keys.find_key(conn, prefix)
        if record is not None:
            KEYS.keep(record, now)
    record = _checked(record, token, scope, now)
    _note_use(record, now)
    return record


def _note_use(record: ApiKey, now: datetime) -> None:
    """Record the key's use when the last record is a minute old; most requests write nothing. The
    cached copy takes `now` too, written here or by a process that won the conditional UPDATE."""
    seen = record.last_used_at
    if seen is not None and (now - seen).total_seconds() < api_keys.TOUCH_EVERY_SECONDS:
        return
    with engine().begin() as conn:
        api_keys.touch_key(conn, record.id, now=now)
    KEYS.used(record, now)


def _quota(record: ApiKey) -> Quota:
    return Quota(
        "api", ((record.rate_limit, float(record.rate_window)),), share=1.0, fail_open=True
    )


def _throttled(record: ApiKey, exc: ThrottledError) -> ApiError:
    wait = max(1, math.ceil(exc.retry_after or record.rate_window))
    return ApiError(
        429,
        "rate_limited",
        None,
        f"over this key's rate of {record.rate_limit} per {record.rate_window}s",
        headers={"Retry-After": str(wait)},
    )


def chunk_size(record: ApiKey) -> int:
    """How many units of the key's budget a process reserves at once (see the module docstring)."""
    return max(1, min(CHUNK_MAX, record.rate_limit // CHUNK_SHARE))


@dataclass
class _Held:
    rate: tuple[int, int]  # the key's (rate_limit, rate_window) the units were reserved under
    left: int
    until: datetime  # one window after they were reserved: then they lapse


class Reserve:
    """Units of each key's rate budget this process reserved in Redis and has not spent yet."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}  # by key prefix
        self._lock = threading.Lock()
        self._refilling: dict[str, threading.Lock] = {}

    def spend(self, record: ApiKey, now: datetime) -> bool:
        """Spend one reserved unit of the key's budget, if this process holds one (no I/O)."""
        with self._lock:
            held = self._held.get(record.prefix)
            if (
                held is None
                or held.left <= 0
                or now >= held.until
                or held.rate != (record.rate_limit, record.rate_window)
            ):
                return False
            held.left -= 1
            return True

    def take(self, record: ApiKey, take: Callable[..., object], now: datetime) -> None:
        """Spend one unit, reserving a chunk from Redis (`take`, RateLimits.take) if none is held;
        near the limit, only the one unit. ApiError 429 when the budget has none left."""
        with self._lock:
            refilling = self._refilling.setdefault(record.prefix, threading.Lock())
        with refilling:  # one reservation per key at a time; the others then spend from it
            if self.spend(record, now):
                return
            quota, scope = _quota(record), f"api-key:{record.id}"
            size = chunk_size(record)
            if size > 1:
                with contextlib.suppress(ThrottledError):  # no room for a chunk: one unit
                    if take(quota, scope, cost=size) is not None:  # None: Redis down, failed open
                        with self._lock:
                            self._held[record.prefix] = _Held(
                                (record.rate_limit, record.rate_window),
                                size - 1,
                                now + timedelta(seconds=record.rate_window),
                            )
                    return
            try:
                take(quota, scope)
            except ThrottledError as exc:
                raise _throttled(record, exc) from exc

    def forget(self) -> None:
        with self._lock:
            self._held.clear()


RESERVE = Reserve()


def limit(record: ApiKey, take: Callable[..., object]) -> None:
    """Spend one request from the key's budget, or 429 with Retry-After (whole seconds, ≥ 1)."""
    RESERVE.take(record, take, clock.now())


# --- the dependencies routes declare ---------------------------------------------------------

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="`Authorization: Bearer clk_…`, a key from `clarion keys create`.",
)


def require(scope: str) -> Callable[..., ApiKey]:
    """A dependency: the caller's API key, holding `scope`, within its rate (or a refusal)."""

    def dependency(
        request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
    ) -> ApiKey:
        return authorize(request.headers.get("authorization"), scope)

    return dependency


def authorize(header: str | None, scope: str) -> ApiKey:
    """The API key an Authorization header carries, holding `scope`, within its rate (or a
    refusal): what require() checks, for a route FastAPI does not serve."""
    record = authenticate(header, scope)
    limit(record, runtime.collaborators().limits.take)
    return record


def authorize_held(header: str | None, scope: str) -> ApiKey | None:
    """authorize() without I/O, for the event loop: the key when this process has it cached (and
    its last use needs no write) and holds a unit of its budget; None when authorize() must run
    (in a thread). Refusals that need no I/O are raised here as there."""
    prefix, token = _token(header)
    now = clock.now()
    record = KEYS.fresh(prefix, now)
    if record is None:
        return None
    record = _checked(record, token, scope, now)
    seen = record.last_used_at
    if seen is None or (now - seen).total_seconds() >= api_keys.TOUCH_EVERY_SECONDS:
        return None
    return record if RESERVE.spend(record, now) else None


def user_id_checked(user_id: str) -> str:
    """A user id from a path: valid text within its size, or a 422 naming `user_id`."""
    try:
        return check.text("user_id", user_id, max_bytes=check.USER_ID_BYTES)
    except ClarionError as exc:
        raise from_clarion(exc) from exc
