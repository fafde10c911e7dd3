"""A type's gate options with their defaults filled in, once, when the type is built.

The catalog file says only what differs (`options: {on_window: defer}`); the gates read these
records and never a default of their own, so a default lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_WINDOW_SECONDS = 120.0  # how long a collapse group stays open after its leader
DEFAULT_UPDATE_SECONDS = 10.0  # least time between two in-place updates of a leader's message


@dataclass(frozen=True)
class CollapseOptions:
    """`options.collapse`: the group key template and its two spacings, in seconds."""

    key: str
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    update_seconds: float = DEFAULT_UPDATE_SECONDS


@dataclass(frozen=True)
class GateOptions:
    """What the gates read of a type's `options`, defaults filled (catalog/model.py checks them)."""

    window_exempt: bool = False  # neither blocked by nor opening the activation window
    on_window: str = "skip"  # skip | defer, when an open activation window blocks the type
    critical: bool = False  # bypasses quiet hours and fatigue caps
    default_on: bool | None = None  # None: the category's default
    delivery: str | None = None  # None: the category's guarantee
    collapse: CollapseOptions | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> GateOptions:
        """The record for a type's raw `options` mapping."""
        default = options.get("default")
        return cls(
            window_exempt=bool(options.get("window_exempt")),
            on_window=str(options.get("on_window") or "skip"),
            critical=bool(options.get("critical")),
            default_on=None if default is None else default in ("on", True),
            delivery=str(options["delivery"]) if options.get("delivery") else None,
            collapse=_collapse(options.get("collapse")),
        )


def _collapse(spec: Any) -> CollapseOptions | None:
    if not spec:
        return None
    return CollapseOptions(
        key=str(spec["key"]),
        window_seconds=float(spec.get("window_seconds", DEFAULT_WINDOW_SECONDS)),
        update_seconds=float(spec.get("update_seconds", DEFAULT_UPDATE_SECONDS)),
    )
