"""A type's `options.digest`: which digest its requests are buffered into, and when that flushes.

    options:
      digest:
        type: seller_digest          # the category-digest type the digest request is sent as
        key: "{{ listing_id }}"      # optional template, like options.collapse.key ("" = one digest)
        window: 1h                   # 30s | 15m | 1h | 2d from the first item, or "daily 08:00"
        max_items: 20                # flush at once when this many are buffered (1-100)
        summariser: anthropic        # optional: none | anthropic | "package.module:callable"
        summary_timeout: 2.0         # seconds the summariser may take (0.1-10)
        summary_max_chars: 160       # a longer line is junk: the fallback is used
        fallback: "{{ count }} new"  # the deterministic summary line (a template over the digest)

Parsed into a frozen DigestSpec at load; every problem is a CatalogError naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import time, timedelta
from typing import Any

MAX_ITEMS = 100  # the most items one digest carries (its request's variables hold them all)
DEFAULT_FALLBACK = "{{ count }} new {{ 'update' if count == 1 else 'updates' }}"
DIGEST_VARIABLES = ("count", "items", "summary", "first_at", "last_at", "types")
FIELDS = frozenset(
    {
        "type",
        "key",
        "window",
        "max_items",
        "summariser",
        "summary_timeout",
        "summary_max_chars",
        "fallback",
        "model",
    }
)
_EVERY = re.compile(r"^\s*(\d+)\s*(s|m|h|d)\s*$")
_DAILY = re.compile(r"^\s*daily\s+([01]?\d|2[0-3]):([0-5]\d)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass(frozen=True)
class DigestSpec:
    """A type's digest: flushed `every` after its first item, or `daily` at a local wall time."""

    type: str
    key: str = ""
    every: timedelta | None = None
    daily: time | None = None
    max_items: int = 50
    summariser: str = "none"
    summary_timeout: float = 2.0
    summary_max_chars: int = 160
    fallback: str = DEFAULT_FALLBACK
    model: str = "claude-haiku-4-5"

    @property
    def window(self) -> str:
        """The window as written in the catalog, normalised ("1:00:00", "daily 08:00")."""
        return f"daily {self.daily:%H:%M}" if self.daily is not None else str(self.every)


def parse_window(value: Any) -> tuple[timedelta | None, time | None]:
    """ "90s" / "15m" / "1h" / "2d" → (timedelta, None); "daily 08:00" → (None, time)."""
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if every := _EVERY.match(text):
        delta = timedelta(**{_UNITS[every[2]]: int(every[1])})
        if timedelta(seconds=1) <= delta <= timedelta(days=31):
            return delta, None
    if daily := _DAILY.match(text):
        return None, time(int(daily[1]), int(daily[2]))
    raise ValueError(
        f"window must be a duration such as 30s, 15m, 1h or 2d (1 s to 31 days) "
        f"or 'daily HH:MM', not {value!r}"
    )


def parse_digest(raw: Any) -> DigestSpec:
    """The DigestSpec of `options.digest`; ValueError naming the field that is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"options.digest must be a mapping, not {raw!r}")
    unknown = set(raw) - FIELDS
    if unknown:
        raise ValueError(
            f"options.digest: unknown fields {sorted(unknown)}; known: {sorted(FIELDS)}"
        )
    target = raw.get("type")
    if not isinstance(target, str) or not target:
        raise ValueError("options.digest.type must name the digest type the items are sent in")
    every, daily = parse_window(raw.get("window"))
    return DigestSpec(
        type=target,
        key=_text(raw, "key", ""),
        every=every,
        daily=daily,
        max_items=_number(raw, "max_items", 50, int, 1, MAX_ITEMS),
        summariser=_text(raw, "summariser", "none") or "none",
        summary_timeout=_number(raw, "summary_timeout", 2.0, float, 0.1, 10.0),
        summary_max_chars=_number(raw, "summary_max_chars", 160, int, 10, 1000),
        fallback=_text(raw, "fallback", DEFAULT_FALLBACK) or DEFAULT_FALLBACK,
        model=_text(raw, "model", "claude-haiku-4-5") or "claude-haiku-4-5",
    )


def _text(raw: dict[str, Any], name: str, default: str) -> str:
    value = raw.get(name, default)
    if not isinstance(value, str):
        raise ValueError(f"options.digest.{name} must be text, not {value!r}")
    return value


def _number(
    raw: dict[str, Any], name: str, default: Any, kind: type, low: float, high: float
) -> Any:
    value = raw.get(name, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        ok = ok and isinstance(value, int)
    if not ok or not low <= value <= high:
        raise ValueError(f"options.digest.{name} must be a number from {low:g} to {high:g}")
    return kind(value)


def render_fallback(spec: DigestSpec, context: dict[str, Any]) -> str:
    """The deterministic summary line: the spec's fallback template over the digest's variables
    (the default line if that template cannot render these items)."""
    from clarion.catalog.sandbox import env, render

    for source in (spec.fallback, DEFAULT_FALLBACK):
        try:
            line = " ".join(render(env.from_string(source), context).split())
        except Exception:  # noqa: BLE001 - whatever a template over item data raises: the next line
            continue
        if line:
            return line[: spec.summary_max_chars]
    return f"{context.get('count', 0)} new"
