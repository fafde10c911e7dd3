"""Escalation chains in the catalog: what a type does when nobody acknowledges it.

    escalation:
      working_hours: "09:00-17:00"   # optional: timers count only these local hours on the
                                     # recipient's working days (`true`: all of each working day)
      steps:                         # step 1 is the notification itself; these follow it
        - {after: 5m, type: page_sms}                 # no ack 5 min after step 1: this type
        - {after: 10m, type: page, to: secondary}     # then to the user named by a variable

`after` is measured from when the previous step fired (`30s`, `5m`, `2h`, or seconds). `type`
defaults to the chain's own type; `to` names a variable (required or defaulted) holding the user
id of the step's recipient, default the chain's own recipient. Checked when the catalog loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

STEP_KEYS = frozenset({"after", "type", "to"})
ESCALATION_KEYS = frozenset({"steps", "working_hours"})
MAX_STEPS = 10
MAX_AFTER = 30 * 24 * 3600.0  # a timer longer than a month is a mistake, not a page
WHOLE_DAY = ("00:00", "24:00")
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(s|m|h)?")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_WINDOW = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])-(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)")

Fail = Callable[[str], Exception]


@dataclass(frozen=True)
class EscalationStep:
    """One step after the first: fire `type_key` at the recipient `to` names, `after` seconds
    after the previous step fired, unless the chain was acknowledged."""

    after: float
    type_key: str
    to: str | None = None  # a variable holding the recipient's user id; None: the chain's own


@dataclass(frozen=True)
class Escalation:
    steps: tuple[EscalationStep, ...]
    working_hours: tuple[str, str] | None = None  # local ("HH:MM", "HH:MM") on working days


def parse_duration(value: Any, what: str, fail: Fail) -> float:
    """Seconds from `30s`, `5m`, `2h` or a number; positive and at most 30 days."""
    seconds = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value.strip())):
        seconds = float(match[1]) * _UNITS[match[2]]
    if seconds is None or not 0 < seconds <= MAX_AFTER:
        raise fail(f"{what} must be a duration like 30s, 5m or 2h (at most 30 days), not {value!r}")
    return seconds


def _window(value: Any, fail: Fail) -> tuple[str, str] | None:
    if value is None or value is False:
        return None
    if value is True:
        return WHOLE_DAY
    match = _WINDOW.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None or f"{match[1]}:{match[2]}" >= match[3]:
        raise fail(
            f"escalation.working_hours must be true or a local window like '09:00-17:00' "
            f"(start before end), not {value!r}"
        )
    return f"{match[1]}:{match[2]}", match[3]


def parse_escalation(key: str, raw: Any, variables: set[str], fail: Fail) -> Escalation | None:
    """The escalation of type `key`, checked on its own (the step types are checked once every
    type is built: check_escalations). `variables` are the type's required and defaulted names."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fail(f"escalation must be a mapping with steps, not {raw!r}")
    unknown = set(raw) - ESCALATION_KEYS
    if unknown:
        raise fail(f"escalation: unknown keys {sorted(unknown)}; known: {sorted(ESCALATION_KEYS)}")
    steps = raw.get("steps")
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        raise fail(f"escalation.steps must be a list of 1 to {MAX_STEPS} steps")
    parsed = []
    for n, spec in enumerate(steps, start=2):
        what = f"escalation step {n}"
        if not isinstance(spec, dict):
            raise fail(f"{what} must be a mapping with after (and type, to), not {spec!r}")
        if unknown := set(spec) - STEP_KEYS:
            raise fail(f"{what}: unknown keys {sorted(unknown)}; known: {sorted(STEP_KEYS)}")
        type_key = spec.get("type", key)
        if not isinstance(type_key, str) or not type_key:
            raise fail(f"{what}: type must name a type, not {type_key!r}")
        to = spec.get("to")
        if to is not None and (not isinstance(to, str) or to not in variables):
            raise fail(
                f"{what}: to must name a required or defaulted variable holding the "
                f"recipient's user id, not {to!r}"
            )
        parsed.append(
            EscalationStep(parse_duration(spec.get("after"), f"{what} after", fail), type_key, to)
        )
    return Escalation(tuple(parsed), _window(raw.get("working_hours"), fail))


def check_escalations(types: Mapping[str, Any], error: type[Exception]) -> None:
    """Every step names a type of the catalog that can be rendered from the chain's variables
    and has no chain of its own (chains do not nest; a step may repeat the chain's own type)."""
    for ntype in types.values():
        if ntype.escalation is None:
            continue
        have = set(ntype.required) | set(ntype.defaults)
        for n, step in enumerate(ntype.escalation.steps, start=2):
            what = f"type {ntype.key!r} escalation step {n}"
            target = types.get(step.type_key)
            if target is None:
                raise error(f"{what}: type {step.type_key!r} is not in the catalog")
            if target.key != ntype.key and target.escalation is not None:
                raise error(f"{what}: type {step.type_key!r} has an escalation of its own")
            if missing := set(target.required) - have:
                raise error(
                    f"{what}: type {step.type_key!r} requires {', '.join(sorted(missing))}, "
                    f"which {ntype.key!r} neither requires nor defaults"
                )
