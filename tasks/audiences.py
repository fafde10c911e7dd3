"""Audiences: topics that recipients join and leave, and segments over recipient fields.

    subscribe("beta-testers", ["user-1", "user-2"])     # in bulk, up to MAX_IDS ids a call
    unsubscribe("beta-testers", ["user-2"])
    broadcast("spring_sale", {"topic": "beta-testers", "segment": {"country": ["DE", "AT"]}})
    broadcast("upgrade", {"segment": {"attributes.plan": "free", "attributes.beta": True}})

Bad input raises an InvalidField naming the part (`user_ids[3]`, `audience.segment.colour`) and
writes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from sqlalchemy import Connection

from clarion import clock
from clarion import validation as check
from clarion.db import ledger, topics
from clarion.db.broadcasts import ATTRIBUTE_PREFIX, SEGMENT_FIELDS, Audience
from clarion.db.engine import in_transaction
from clarion.errors import InvalidField, UnknownRecipient, UnknownTopic
from clarion.tasks.producer import checked_connection

MAX_IDS = 10_000  # user ids in one subscribe/unsubscribe call
MAX_VALUES = 1_000  # values one segment field may take
VALUE_BYTES = 256
TOPIC = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
AUDIENCE_KEYS = ("topic", "segment")


def checked_topic(value: object, field: str = "topic") -> str:
    """A topic key: letters, digits and `_ . : -`, up to 128 characters."""
    if not isinstance(value, str) or not TOPIC.fullmatch(value):
        raise InvalidField(
            field,
            f"must be 1-128 letters, digits or _ . : - (starting with one of the first "
            f"two), not {check.show(value)}",
        )
    return value


def checked_ids(value: object, field: str = "user_ids") -> list[str]:
    """A list of 1 to MAX_IDS user ids (repeats are kept once)."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidField(field, f"must be a list of user ids, not {check.show(value)}")
    if not 1 <= len(value) <= MAX_IDS:
        raise InvalidField(field, f"must hold 1 to {MAX_IDS} user ids, not {len(value)}")
    ids = [
        check.text(f"{field}[{n}]", v, max_bytes=check.USER_ID_BYTES) for n, v in enumerate(value)
    ]
    return list(dict.fromkeys(ids))


def checked_audience(value: object) -> Audience:
    """{"topic": key} and/or {"segment": {field: value or [values]}}; at least one of the two.
    Segment fields: SEGMENT_FIELDS. Whether the topic exists is checked against the database."""
    if not isinstance(value, Mapping):
        raise InvalidField("audience", f"must be a mapping, not {check.show(value)}")
    for key in value:
        if key not in AUDIENCE_KEYS:
            raise InvalidField(
                f"audience.{key if isinstance(key, str) else check.show(key)}",
                f"is not part of an audience; known: {', '.join(AUDIENCE_KEYS)}",
            )
    topic = value.get("topic")
    segment = value.get("segment")
    if topic is None and not segment:
        raise InvalidField("audience", "name a topic, a segment or both")
    return Audience(
        None if topic is None else checked_topic(topic, "audience.topic"), _segment(segment)
    )


def _segment(value: object) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidField("audience.segment", f"must be a mapping, not {check.show(value)}")
    filters = []
    for name, wanted in value.items():
        field = f"audience.segment.{name if isinstance(name, str) else check.show(name)}"
        custom = isinstance(name, str) and name.startswith(ATTRIBUTE_PREFIX)
        if custom:
            check.attribute_name(name.removeprefix(ATTRIBUTE_PREFIX), field)
        elif name not in SEGMENT_FIELDS:
            raise InvalidField(
                field,
                f"is not a segment field; known: {', '.join(sorted(SEGMENT_FIELDS))}, or "
                f"{ATTRIBUTE_PREFIX}<name> for a custom attribute",
            )
        values = [wanted] if isinstance(wanted, str | int) else wanted
        if not isinstance(values, list) or not 1 <= len(values) <= MAX_VALUES:
            raise InvalidField(field, f"must be a value or a list of 1 to {MAX_VALUES} values")
        texts = tuple(
            _attribute_text(f"{field}[{n}]", v)
            if custom
            else check.text(f"{field}[{n}]", v, max_bytes=VALUE_BYTES)
            for n, v in enumerate(values)
        )
        filters.append((str(name), texts))
    return tuple(sorted(filters))


def _attribute_text(field: str, value: object) -> str:
    """A value a custom attribute is compared with, as the text `->>` gives for it."""
    checked = check.attribute_value(value, field)
    return json.dumps(checked) if isinstance(checked, bool | int) else checked


def require_known(conn: Connection, audience: Audience) -> None:
    """The audience's topic and custom attributes exist (a typo would otherwise reach nobody,
    silently): UnknownTopic, or InvalidField naming the segment's attribute."""
    if audience.topic is not None and not topics.exists(conn, audience.topic):
        raise UnknownTopic(audience.topic)
    names = [
        f.removeprefix(ATTRIBUTE_PREFIX)
        for f, _ in audience.segment
        if f.startswith(ATTRIBUTE_PREFIX)
    ]
    if names:
        known = ledger.known_attributes(conn, names)
        for name in names:
            if name not in known:
                raise InvalidField(
                    f"audience.segment.{ATTRIBUTE_PREFIX}{name}",
                    "is not an attribute any recipient was given (register_recipient("
                    "attributes=…) or PUT /v1/users/{id})",
                )


def subscribe(topic: str, user_ids: Sequence[str], *, connection: Connection | None = None) -> int:
    """Add registered recipients to a topic (created on first use); returns how many joined now.
    An unknown or erased user id raises UnknownRecipient and adds nobody."""
    key, ids = checked_topic(topic), checked_ids(user_ids)

    def join(conn: Connection) -> int:
        known = ledger.recipient_locales(conn, ids)
        unknown = [u for u in ids if u not in known]
        if unknown:
            raise UnknownRecipient(unknown[0])
        return topics.join(conn, key, ids, now=clock.now())

    return in_transaction(checked_connection(connection), join)


def unsubscribe(
    topic: str, user_ids: Sequence[str], *, connection: Connection | None = None
) -> int:
    """Remove recipients from a topic; returns how many were members (others are no error)."""
    key, ids = checked_topic(topic), checked_ids(user_ids)
    return in_transaction(checked_connection(connection), lambda c: topics.leave(c, key, ids))
