"""What every inbound door does before it trusts a byte: a size limit, then a check of who sent it,
then parsing into a checked shape. Each refusal is a `Refused` (a ClarionError carrying the HTTP
status and a short reason) that the door answers with a short JSON body; nothing here raises
anything else for any input.

The readers (`text`, `obj`, `ident`, `json_value`) pull one field out of parsed JSON with its type
checked and name the field in the refusal: the shape checks of web/slack_envelope.py and
web/teams_envelope.py are written with them instead of `.get()` chains.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from clarion.errors import ClarionError

log = logging.getLogger(__name__)

MAX_DEPTH = 16  # nesting of a free-form JSON value (a button value, card data) inside an envelope
MAX_TEXT = 4000
IDENT = re.compile(
    r"[A-Za-z0-9_.:@;=+/#-]{1,512}"
)  # platform ids: U0123, 29:1abc, a:1x, 19:x@thread.v2


class Refused(ClarionError):
    """An inbound request refused at the door: `status` (4xx) and a short `reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status, self.reason = status, reason[:200]


def local_path(request: Request) -> str:
    """The request's path below clarion's own root: "/v1/events" whether clarion is served at
    the top or mounted by a host app under a prefix (Starlette keeps the prefix in `root_path`)."""
    path, root = request.url.path, request.scope.get("root_path", "").rstrip("/")
    return path[len(root) :] or "/" if root and path.startswith(root) else path


def refusal(error: Refused, door: str) -> JSONResponse:
    """The short answer to a refused request (logged at info: a refusal is not an error)."""
    log.info(
        "%s request refused: %s",
        door,
        error.reason,
        extra={"action": f"{door}_refused", "status": error.status, "reason": error.reason},
    )
    return JSONResponse({"error": error.reason}, status_code=error.status)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past `limit` bytes (announced or actually sent)."""
    announced = request.headers.get("content-length")
    if announced is not None:
        if not (announced.isascii() and announced.isdigit() and len(announced) < 16):
            raise Refused(400, "bad content-length")
        if int(announced) > limit:
            raise Refused(413, f"body over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes | str, what: str = "body") -> Any:
    """Strict UTF-8 JSON; anything else (bad bytes, bad JSON, absurd nesting or numbers) is a 400."""
    try:
        text_ = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(text_)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Refused(400, f"{what} is not JSON ({type(exc).__name__})") from exc


def clean(value: str, field: str, max_len: int = MAX_TEXT) -> str:
    """A string that PostgreSQL text and UTF-8 can hold (no NUL, no lone surrogate), length-capped."""
    if len(value) > max_len:
        raise Refused(400, f"{field}: longer than {max_len}")
    if "\x00" in value or (not value.isascii() and _has_surrogate(value)):
        raise Refused(400, f"{field}: not storable text")
    return value


def _has_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def obj(
    data: Mapping[str, Any], key: str, field: str, *, required: bool = False
) -> Mapping[str, Any] | None:
    """data[key] as a JSON object (None if absent or null and not required)."""
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, dict):
        raise Refused(400, f"{field}: expected an object")
    return value


def text(
    data: Mapping[str, Any],
    key: str,
    field: str,
    *,
    required: bool = False,
    max_len: int = MAX_TEXT,
) -> str | None:
    """data[key] as a string (None if absent or null and not required)."""
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise Refused(400, f"{field}: expected a string")
    return clean(value, field, max_len)


def ident(data: Mapping[str, Any], key: str, field: str, *, required: bool = False) -> str | None:
    """data[key] as a platform id (letters, digits and a few separators, at most 512)."""
    value = text(data, key, field, required=required, max_len=512)
    if value is not None and not IDENT.fullmatch(value):
        raise Refused(400, f"{field}: not an id")
    return value


def json_value(value: Any, field: str, max_depth: int = MAX_DEPTH) -> Any:
    """A free-form JSON value, checked without recursion: storable strings, bounded nesting."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise Refused(400, f"{field}: nested deeper than {max_depth}")
        if isinstance(item, str):
            clean(item, field, max_len=1 << 20)
        elif isinstance(item, dict):
            for key, child in item.items():
                clean(key, field, max_len=1 << 20)
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return value
