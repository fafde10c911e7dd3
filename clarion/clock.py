"""The one clock seam. Code outside scheduling/ and gates/ asks here; those take `now` as a parameter."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

_source: Callable[[], datetime] = lambda: datetime.now(UTC)  # noqa: E731


def now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return _source()


def set_source(source: Callable[[], datetime] | None) -> None:
    """Replace the clock (tests); None restores the system clock."""
    global _source
    _source = source or (lambda: datetime.now(UTC))
