"""Every refusal of the HTTP API, in one JSON shape: `{"error": code, "field": name, "reason": text}`.

`field` names what to fix as the caller wrote it: a body member (`variables.order`,
`items[3].dedup_key`), a header (`Authorization`, `Idempotency-Key`), `body` for the body as a
whole, or null when nothing of the request is wrong (a rate limit). Clarion's own InvalidField
errors, pydantic's shape errors and FastAPI's path/query errors all come out in this shape.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from clarion.errors import (
    ClarionError,
    ConfigurationError,
    InvalidField,
    MissingVariables,
    UnknownRecipient,
    UnknownType,
)

log = logging.getLogger(__name__)

MAX_FIELD = 200
# notify()'s names → the names of the HTTP contract (the seed's request shape).
RENAMED = {"type_key": "type", "occurrence_key": "dedup_key"}
NOTE = re.compile(r"in items\[(\d+)\]")


class ApiError(ClarionError):
    """A refused API request: the HTTP status, a stable code, the field and a short reason."""

    def __init__(
        self,
        status: int,
        code: str,
        field: str | None,
        reason: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {field}: {reason}")
        self.status, self.code, self.reason = status, code, reason[:500]
        self.field = None if field is None else safe_field(field)
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "field": self.field, "reason": self.reason, **self.extra}


def safe_field(name: str) -> str:
    """A field name that JSON can carry and a log can show: escapes NUL and lone surrogates
    (a caller's unknown key can hold anything), cut to MAX_FIELD characters."""
    cleaned = name.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return cleaned if len(cleaned) <= MAX_FIELD else cleaned[:MAX_FIELD] + "…"


def contract_field(field: str, prefix: str = "") -> str:
    """notify()'s field name in the HTTP contract's words: `type_key` → `type`, under `prefix`."""
    head, sep, rest = field.partition(".")
    bracket = head.find("[")
    name, tail = (head, "") if bracket < 0 else (head[:bracket], head[bracket:])
    renamed = RENAMED.get(name, name) + tail + sep + rest
    return f"{prefix}.{renamed}" if prefix else renamed


def item_index(exc: BaseException) -> int | None:
    """The batch index notify_many() names in its note (`in items[3]`), if any."""
    for note in getattr(exc, "__notes__", ()):
        if match := NOTE.fullmatch(note):
            return int(match.group(1))
    return None


def from_clarion(exc: ClarionError, prefix: str = "") -> ApiError:
    """The API refusal for an error clarion raised on bad input (nothing was written)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidField):
        return ApiError(422, "invalid_field", contract_field(exc.field, prefix), exc.reason)
    if isinstance(exc, UnknownType):
        return ApiError(422, "unknown_type", contract_field("type", prefix), str(exc))
    if isinstance(exc, MissingVariables):
        return ApiError(
            422,
            "missing_variables",
            contract_field("variables", prefix),
            str(exc),
            extra={"missing": exc.missing},
        )
    if isinstance(exc, UnknownRecipient):
        return ApiError(
            422,
            "unknown_recipient",
            contract_field("user_id", prefix),
            f"{exc} (register the recipient before notifying them)",
        )
    if isinstance(exc, ConfigurationError):  # our fault, not the caller's: never a 4xx
        log.error("API refused for configuration: %s", exc, extra={"action": "api_unavailable"})
        return ApiError(503, "unavailable", None, str(exc)[:300])
    return ApiError(422, "invalid_request", prefix or "body", str(exc))


def from_pydantic(errors: Iterable[Mapping[str, Any]], prefix: str = "") -> ApiError:
    """The first shape error pydantic (or FastAPI) found, with its location as a field name."""
    first = next(iter(errors), None)
    if first is None:
        return ApiError(422, "invalid_field", prefix or "body", "is malformed")
    loc = [part for part in first.get("loc", ()) if part not in ("body",)]
    where = "query" if loc[:1] == ["query"] else "path" if loc[:1] == ["path"] else None
    if where:
        loc = loc[1:]
    field = prefix
    for part in loc:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    reason = {"extra_forbidden": "is not a field of this request", "missing": "is required"}.get(
        str(first.get("type")), str(first.get("msg", "is malformed"))
    )
    return ApiError(422, "invalid_field", field or "body", reason)


def response(error: ApiError) -> Response:
    """The JSON answer for a refusal (ASCII-escaped: a field may carry anything the caller sent)."""
    if error.status < 500:
        log.info(
            "API request refused: %s %s",
            error.code,
            error.field,
            extra={"action": "api_refused", "status": error.status, "code": error.code},
        )
    return AsciiJSONResponse(error.body(), status_code=error.status, headers=error.headers)


def ascii_json(content: Any) -> bytes:
    return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: never fails on a lone surrogate."""

    def render(self, content: Any) -> bytes:
        return ascii_json(content)


async def api_error_handler(request: Request, exc: Exception) -> Response:
    """Any ClarionError that reaches the app: an ApiError as it is, the rest through from_clarion
    (e.g. an unmigrated database while checking a key: a 503 saying so, not a traceback)."""
    assert isinstance(exc, ClarionError)
    return response(from_clarion(exc))


async def validation_handler(request: Request, exc: Exception) -> Response:
    """FastAPI's own path and query checks, in clarion's shape."""
    errors = exc.errors() if isinstance(exc, RequestValidationError | ValidationError) else []
    return response(from_pydantic(errors))
