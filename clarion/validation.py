"""Input checks shared by every producer entry point: notify, notify_many, register_recipient and the
series functions.

Each check returns the cleaned value or raises `InvalidField` naming the field (`variables.order`,
`addresses.email`, `items[3].user_id`). None of them touches the database, so a refused call writes
nothing and leaves a caller's transaction usable. Text is refused where PostgreSQL could not store it
(NUL, lone surrogates) or where it would outgrow an index row (byte caps below).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, time
from typing import Any
from urllib.parse import urlsplit

from email_validator import EmailNotValidError, validate_email

from clarion.catalog.locales import normalise as normalise_locale
from clarion.errors import InvalidField, InvalidOccurrence

# Byte caps (UTF-8). The unique index of a delivery holds user_id + type_key + occurrence_key +
# channel: these caps keep it far below PostgreSQL's btree row limit (about 2.7 kB). An event id
# is stored as the occurrence key `event:<event_id>` (518 bytes at most): the cap is the caller's
# id, the prefix is ours (tests/integration/test_producer_input.py tries the boundary).
USER_ID_BYTES = 256
TYPE_KEY_BYTES = 128
OCCURRENCE_KEY_BYTES = 512
EVENT_ID_BYTES = 512
SERIES_KEY_BYTES = 512
ORG_ID_BYTES = 256
ADDRESS_BYTES = 2048
MAX_ADDRESSES = 32
LOCALE_CHARS = 35
DEFAULT_MAX_DEPTH = (
    16  # containers nested inside variables, the variables mapping itself is level 1
)
DEFAULT_MAX_BYTES = 64 * 1024  # variables encoded as compact JSON
MAX_INT = 2**63  # JSON integers must fit in 64 bits; bigger numbers travel as strings
# occurrence keys only series, escalation chains and broadcasts write
RESERVED_PREFIXES = ("series:", "escalation:", "broadcast:")
WRITTEN_BY = {"series:": "series", "escalation:": "escalation chains", "broadcast:": "broadcasts"}

CHANNEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
SLACK_USER = re.compile(r"[UW][A-Z0-9]{1,31}")
E164 = re.compile(r"\+[1-9][0-9]{7,14}")
PUSH_DEVICE = re.compile(r"(fcm:[A-Za-z0-9_:\-]{16,4096}|apns:[0-9A-Fa-f]{64,200})")
MAX_DEVICES = 10
HH_MM = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]")
SUBDIVISION = re.compile(r"[A-Za-z0-9]{1,3}")
ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_ATTRIBUTES = 64
ATTRIBUTE_BYTES = 256
MAX_ATTRIBUTE_INT = 2**53  # what a JSON reader in any language keeps exact


def show(value: object, limit: int = 40) -> str:
    """A short, safe excerpt of a value for an error message (never calls a foreign __repr__)."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])
    elif value is None or isinstance(value, bool | float):
        text = repr(value)
    elif isinstance(value, int):
        text = repr(value) if abs(value) < 10**limit else "a very large integer"
    else:
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "…"


def _unclean(value: str) -> str | None:
    """Why PostgreSQL cannot store `value` (a NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"is not valid Unicode text (lone surrogate at {exc.start})"
    return None


def _clean(field: str, value: str) -> None:
    if (why := _unclean(value)) is not None:
        raise InvalidField(field, why)


def text(field: str, value: object, *, max_bytes: int, empty: bool = False) -> str:
    """A string PostgreSQL can store and index: no NUL, no lone surrogates, at most max_bytes."""
    if not isinstance(value, str):
        raise InvalidField(field, f"must be a string, not {show(value)}")
    if not value and not empty:
        raise InvalidField(field, "must not be empty")
    if len(value) > max_bytes:
        raise InvalidField(field, f"must be at most {max_bytes} bytes, not {len(value)} characters")
    _clean(field, value)
    size = len(value) if value.isascii() else len(value.encode("utf-8"))
    if size > max_bytes:
        raise InvalidField(field, f"must be at most {max_bytes} bytes of UTF-8, not {size}")
    return str(value)


def optional_text(field: str, value: object, *, max_bytes: int) -> str | None:
    return None if value is None else text(field, value, max_bytes=max_bytes)


# --- variables ------------------------------------------------------------------------------------


def variables(
    value: object,
    *,
    field: str = "variables",
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, Any]:
    """A plain JSON copy of template variables: a mapping with string keys whose values are str,
    int (64-bit), finite float, bool, None, lists and mappings, nested at most `max_depth` deep
    and at most `max_bytes` as compact JSON. Tuples become lists, mapping types become dicts."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidField(field, f"must be a mapping of names to JSON values, not {show(value)}")
    copy, most = _copy_json(value, field, max_depth, max_bytes)
    if most <= max_bytes:  # the usual case: encoding it could not reach the cap
        return copy
    size = len(json.dumps(copy, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > max_bytes:
        raise InvalidField(field, f"must be at most {max_bytes} bytes as JSON, not {size}")
    return copy


# The most bytes of compact JSON (ensure_ascii=False) a scalar can take: a character of a string
# at most 6 (a control character's \u0000 escape; UTF-8 takes at most 4), a 64-bit int 20, a
# float's repr 24, null/true/false 5.
_MOST_PER_CHAR, _MOST_INT, _MOST_FLOAT, _MOST_WORD = 6, 20, 24, 5


def _copy_json(
    root: Mapping, field: str, max_depth: int, max_bytes: int
) -> tuple[dict[str, Any], int]:
    """The copy, and an upper bound of its compact JSON size (the exact size, a json.dumps, is
    needed only when the bound passes max_bytes: measured, it was a fifth of a 500-event batch's
    CPU). Iterative (no recursion, so no RecursionError); stops as soon as a lower bound of the
    encoded size passes max_bytes, so a huge value costs little to refuse."""
    out: dict[str, Any] = {}
    stack: list[tuple[Any, Any, str, int]] = [(root, out, field, 1)]
    budget, most = 0, 2
    while stack:
        source, target, path, depth = stack.pop()
        if depth > max_depth:
            raise InvalidField(path, f"nests deeper than {max_depth} levels")
        for index, (key, item) in enumerate(_members(source, path)):
            budget += 2 + len(key or "") + (len(item) if isinstance(item, str) else 0)
            if budget > max_bytes:
                raise InvalidField(field, f"must be at most {max_bytes} bytes as JSON")
            most += 1 + (0 if key is None else 3 + _MOST_PER_CHAR * len(key)) + _most(item)
            try:
                plain = _plain(item)
            except _Unfit as unfit:  # the member's name is worked out for errors only
                raise InvalidField(_where(path, key, index), str(unfit)) from None
            if isinstance(plain, dict | list):
                stack.append((item, plain, _where(path, key, index), depth + 1))
            if key is None:
                target.append(plain)
            else:
                target[key] = plain
    return out, most


def _most(item: object) -> int:
    """The most bytes `item` adds as compact JSON, not counting its members if it has any."""
    if isinstance(item, str):
        return 2 + _MOST_PER_CHAR * len(item)
    if item is None or isinstance(item, bool):
        return _MOST_WORD
    if isinstance(item, int):
        return _MOST_INT
    if isinstance(item, float):
        return _MOST_FLOAT
    return 2  # a container's brackets; its members are counted as they are copied


def _members(source: Any, path: str) -> Iterator[tuple[str | None, Any]]:
    """(key, or None for a list item, value) for each member of a mapping or list."""
    if isinstance(source, Mapping):
        for key, item in source.items():
            if not isinstance(key, str):
                raise InvalidField(path, f"keys must be strings, not {show(key)}")
            if (why := _unclean(key)) is not None:
                raise InvalidField(f"{path} key {show(key)}", why)
            yield str(key), item
    else:
        for item in source:
            yield None, item


def _where(path: str, key: str | None, index: int) -> str:
    """A member's field name in an error: `variables.order.lines[2]`."""
    return f"{path}[{index}]" if key is None else f"{path}.{key[:60]}"


class _Unfit(ValueError):
    """A value that is not plain JSON (the message; the caller names the field)."""


def _plain(item: object) -> Any:
    """The plain JSON form of one value: a scalar, or an empty dict/list to fill."""
    if item is None or isinstance(item, bool):
        return item
    if isinstance(item, str):
        if (why := _unclean(item)) is not None:
            raise _Unfit(why)
        return str(item)
    if isinstance(item, int):
        if not -MAX_INT <= item < MAX_INT:
            raise _Unfit("integers must fit in 64 bits; send bigger numbers as strings")
        return int(item)
    if isinstance(item, float):
        if not math.isfinite(item):
            raise _Unfit(f"numbers must be finite, not {item!r}")
        return float(item)
    if isinstance(item, Mapping):
        return {}
    if isinstance(item, list | tuple):
        return []
    raise _Unfit(
        f"must be a JSON value (str, int, float, bool, None, list or mapping), not {show(item)}"
    )


# --- recipients -----------------------------------------------------------------------------------


def _email(field: str, value: str) -> None:
    try:
        validate_email(value, check_deliverability=False)
    except EmailNotValidError as exc:
        raise InvalidField(field, f"not an email address: {exc}") from exc


def _pattern(regex: re.Pattern[str], what: str) -> Callable[[str, str], None]:
    def check(field: str, value: str) -> None:
        if not regex.fullmatch(value):
            raise InvalidField(field, f"must be {what}, not {show(value)}")

    return check


def _url(field: str, value: str) -> None:
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError as exc:
        raise InvalidField(field, f"not a URL: {exc}") from exc
    if (
        parts.scheme not in ("http", "https")
        or not host
        or any(c.isspace() or ord(c) < 32 for c in value)
    ):
        raise InvalidField(field, f"must be an http(s) URL, not {show(value)}")


def _devices(field: str, value: str) -> None:
    devices = value.split()
    if not devices or len(devices) > MAX_DEVICES:
        raise InvalidField(field, f"1 to {MAX_DEVICES} devices, not {len(devices)}")
    for i, device in enumerate(devices):
        if not PUSH_DEVICE.fullmatch(device):
            raise InvalidField(
                f"{field}[{i}]", f"must be 'fcm:<token>' or 'apns:<hex token>', not {show(device)}"
            )


def _nothing(field: str, value: str) -> None:
    """Channels without a format of their own (teams user ids, stored references)."""


ADDRESS_FORMATS: dict[str, Callable[[str, str], None]] = {
    "email": _email,
    "slack": _pattern(SLACK_USER, "a Slack user id such as U0123ABCD or W0123ABCD"),
    "sms": _pattern(E164, "an E.164 number: + and 8 to 15 digits, such as +4915112345678"),
    "webhook": _url,
    "teams": _nothing,
    "push": _devices,
}


def addresses(value: object, field: str = "addresses") -> dict[str, str]:
    """Channel name → address. Known channels get a format check; every address is non-empty text
    of at most ADDRESS_BYTES; at most MAX_ADDRESSES channels."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidField(field, f"must map channel names to addresses, not {show(value)}")
    if len(value) > MAX_ADDRESSES:
        raise InvalidField(field, f"at most {MAX_ADDRESSES} channels, not {len(value)}")
    out: dict[str, str] = {}
    for channel, address in value.items():
        if not isinstance(channel, str) or not CHANNEL_NAME.fullmatch(channel):
            raise InvalidField(
                field, f"channel names are lower-case words like 'email', not {show(channel)}"
            )
        where = f"{field}.{channel}"
        if channel == "push" and isinstance(address, list | tuple):  # several devices
            address = " ".join(
                text(f"{where}[{i}]", a, max_bytes=ADDRESS_BYTES) for i, a in enumerate(address)
            )
        out[channel] = text(where, address, max_bytes=ADDRESS_BYTES)
        ADDRESS_FORMATS.get(channel, _nothing)(where, out[channel])
    return out


def locale(value: object, field: str = "locale") -> str:
    """A BCP 47 language tag such as en, de-AT, zh-Hant-TW or es-419, in its canonical spelling:
    the POSIX and upper-case spellings people send (`en_US`, `EN`) are the same tags."""
    value = text(field, value, max_bytes=LOCALE_CHARS)
    canonical = normalise_locale(value) if value == value.strip() else None
    if canonical is None:
        raise InvalidField(
            field, f"must be a BCP 47 language tag such as 'en' or 'de-AT', not {show(value)}"
        )
    return canonical


def country(value: object, field: str = "country") -> str | None:
    """An ISO 3166 alpha-2 code (any case in, upper case out), or None."""
    if value is None:
        return None
    if not (isinstance(value, str) and len(value) == 2 and value.isascii() and value.isalpha()):
        raise InvalidField(
            field, f"must be an ISO 3166 alpha-2 code such as 'DE', not {show(value)}"
        )
    return value.upper()


def subdivision(value: object, field: str = "subdivision") -> str | None:
    """The part after the dash of an ISO 3166-2 code (BY for DE-BY): 1–3 letters or digits."""
    if value is None:
        return None
    if not (isinstance(value, str) and value.isascii() and SUBDIVISION.fullmatch(value)):
        raise InvalidField(
            field,
            f"must be an ISO 3166-2 subdivision code such as 'BY' (1-3 letters "
            f"or digits, without the country), not {show(value)}",
        )
    return value.upper()


def attribute_name(value: object, field: str) -> str:
    """A custom attribute's name: a letter or _, then letters, digits or _ (64 at most)."""
    if not (isinstance(value, str) and value.isascii() and ATTRIBUTE_NAME.fullmatch(value)):
        raise InvalidField(
            field, f"must be a letter or _ then up to 63 letters, digits or _, not {show(value)}"
        )
    return value


def attribute_value(value: object, field: str) -> str | int | bool:
    """A custom attribute's value: text (up to ATTRIBUTE_BYTES), an integer or a boolean, so
    that a segment compares it as the text PostgreSQL's `->>` gives (`true`, `12`)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_ATTRIBUTE_INT:
            raise InvalidField(field, f"must be an integer within ±2**53, not {show(value)}")
        return int(value)
    if isinstance(value, str):
        return text(field, value, max_bytes=ATTRIBUTE_BYTES, empty=True)
    raise InvalidField(field, f"must be a text, an integer or a boolean, not {show(value)}")


def attributes(value: object, field: str = "attributes") -> dict[str, str | int | bool] | None:
    """A recipient's custom attributes: None (keep those stored) or a mapping of up to
    MAX_ATTRIBUTES names to values (replacing them all; {} clears them)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidField(field, f"must be a mapping of names to values, not {show(value)}")
    if len(value) > MAX_ATTRIBUTES:
        raise InvalidField(
            field, f"must hold at most {MAX_ATTRIBUTES} attributes, not {len(value)}"
        )
    checked: dict[str, str | int | bool] = {}
    for name, item in value.items():
        key = attribute_name(name, f"{field}.{name if isinstance(name, str) else show(name)}")
        checked[key] = attribute_value(item, f"{field}.{key}")
    return checked


def workweek(value: object, field: str = "workweek") -> list[int] | None:
    """Working weekdays, Monday=0 … Sunday=6: a non-empty list (or tuple or set) of ints."""
    if value is None:
        return None
    if (
        not isinstance(value, list | tuple | set | frozenset)
        or not value
        or len(value) > 7 * 4
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 6 for d in value)
    ):
        raise InvalidField(field, "must list weekdays as integers 0 (Monday) to 6 (Sunday)")
    return sorted({int(d) for d in value})


def clock_time(field: str, value: object) -> time:
    """A local time of day: 'HH:MM' (24 hours) or a naive datetime.time."""
    if isinstance(value, time):
        if value.tzinfo is not None:
            raise InvalidField(field, "must be a local time of day without a time zone")
        return value
    if isinstance(value, str) and value.isascii() and HH_MM.fullmatch(value):
        return time(int(value[:2]), int(value[3:]))
    raise InvalidField(field, f"must be an 'HH:MM' time such as '22:00', not {show(value)}")


def quiet_hours(value: object, field: str = "quiet_hours") -> tuple[time | None, time | None]:
    """A daily local window (start, end), e.g. ('22:00', '07:00'); None for no quiet hours."""
    if value is None:
        return None, None
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidField(field, "must be a (start, end) pair of 'HH:MM' times")
    return clock_time(f"{field}[0]", value[0]), clock_time(f"{field}[1]", value[1])


# --- occurrences and series -----------------------------------------------------------------------


def occurrence_key(event_id: object, occurrence_key: object) -> str:
    """The request's occurrence key: `event:<event_id>`, or an explicit occurrence key that does
    not start with a reserved prefix (`series:`, `escalation:` and `broadcast:` keys are written by
    series, escalation chains and broadcasts only)."""
    if (event_id is None) == (occurrence_key is None):
        raise InvalidOccurrence("give exactly one of event_id or occurrence_key")
    try:
        if occurrence_key is None:
            return "event:" + text("event_id", event_id, max_bytes=EVENT_ID_BYTES)
        key = text("occurrence_key", occurrence_key, max_bytes=OCCURRENCE_KEY_BYTES)
    except InvalidField as exc:
        raise InvalidOccurrence(exc.reason, exc.field) from exc
    if key.startswith(RESERVED_PREFIXES):
        prefix = next(p for p in RESERVED_PREFIXES if key.startswith(p))
        raise InvalidOccurrence(
            f"keys starting with {prefix!r} are reserved for " + WRITTEN_BY[prefix]
        )
    return key


def positive_int(field: str, value: object, *, maximum: int) -> int:
    """An int (not a bool) from 1 to maximum."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidField(field, f"must be a whole number from 1 to {maximum}, not {show(value)}")
    return int(value)


def aware_datetime(field: str, value: object) -> datetime:
    """A timezone-aware datetime (an instant)."""
    if not isinstance(value, datetime):
        raise InvalidField(field, f"must be a timezone-aware datetime, not {show(value)}")
    try:
        offset = value.utcoffset()
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidField(field, "has a time zone that gives no offset") from exc
    if offset is None:
        raise InvalidField(field, "must be timezone-aware")
    return value
