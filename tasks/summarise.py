"""The AI summary line of a digest: a pluggable summariser, never waited on past its deadline.

A summariser is any callable taking a SummaryRequest and returning the line as text. The catalog
names it per digest (`options.digest.summariser`): `none`, `anthropic` (tasks/summarise_anthropic.py,
the optional `ai` extra) or `package.module:callable`. It runs in a daemon thread; after
`summary_timeout` seconds the digest goes on with the deterministic fallback line, as it does when
the summariser raises, refuses, or returns junk (not text, empty, several lines, too long).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from clarion.errors import ConfigurationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SummaryRequest:
    """What a summariser is given: the digest's items and the limits its answer must keep."""

    digest_type: str
    count: int
    items: tuple[dict[str, Any], ...]
    fallback: str
    max_chars: int
    timeout: float
    model: str


Summariser = Callable[[SummaryRequest], object]
BUILT_IN = {"anthropic": "clarion.tasks.summarise_anthropic:summarise"}


@cache
def resolve(name: str) -> Summariser | None:
    """The summariser a catalog names; None for `none`. A name that does not import is a
    ConfigurationError (so is a missing `anthropic` package for `anthropic`)."""
    if name == "none":
        return None
    module_name, _, attribute = BUILT_IN.get(name, name).partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute or "summarise")
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"summariser {name!r} cannot be loaded: {exc}") from exc
    if not callable(found):
        raise ConfigurationError(f"summariser {name!r} is not callable")
    return found


def summary_line(summariser: Summariser | None, request: SummaryRequest) -> tuple[str, str]:
    """(line, source): the summariser's line, or the fallback with why (`timeout`, `error`,
    `junk`, `none`). Returns within request.timeout (plus a thread start) whatever it does."""
    if summariser is None:
        return request.fallback, "none"
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["line"] = summariser(request)
        except BaseException as exc:  # noqa: BLE001 - an unreliable dependency: any failure
            box["error"] = exc

    worker = threading.Thread(target=call, name=f"summarise-{request.digest_type}", daemon=True)
    worker.start()
    worker.join(request.timeout)
    if worker.is_alive():
        return _fallback(request, "timeout", f"no answer in {request.timeout:g} s")
    if "error" in box:
        return _fallback(request, "error", f"{type(box['error']).__name__}: {box['error']}")
    line = clean(box.get("line"), request.max_chars)
    if line is None:
        return _fallback(request, "junk", repr(box.get("line"))[:200])
    return line, "summariser"


def clean(value: object, max_chars: int) -> str | None:
    """The line if it is usable: text, one line, not empty, at most max_chars; else None."""
    if not isinstance(value, str):
        return None
    line = value.strip()
    if not line or len(line) > max_chars or any(c in line for c in "\r\n\x00"):
        return None
    if not line.isprintable():
        return None
    return line


def _fallback(request: SummaryRequest, why: str, detail: str) -> tuple[str, str]:
    log.warning(
        "digest summary fell back (%s): %s",
        why,
        detail,
        extra={"action": "digest_summary_fallback", "why": why, "digest_type": request.digest_type},
    )
    return request.fallback, why
