"""The rows of the route path as typed records: what db/ returns and gates/ and tasks/ read.

Each record is built at the db boundary by `from_row` (a result row's mapping, or its tuple in
column order); callers use attributes. A test's fake recipient is built from the same class, so a
field the database returns and a test forgets is a TypeError, not silent drift. Nothing here does
I/O and nothing of ours is imported but the base.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, time
from typing import Any, Protocol, Self, TypeVar

from sqlalchemy.engine import Row

Key = tuple[str, int]  # (user_id, id) of a request or a delivery


class _FromRow:
    """`from_row`: a record from a result row, a mapping by column name or a tuple in field order."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Sequence[Any]) -> Self:
        # A row in column order with every field, the route path's case, is filled in directly:
        # a frozen dataclass's __init__ calls object.__setattr__ once per field (half the cost of
        # building a record). Checked first: an isinstance against the Mapping ABC costs ~0.8 µs.
        if isinstance(row, Row | tuple | list):
            names = _field_names(cls)
            if len(row) != len(names):
                return cls(*row)  # defaults for the columns left off, or the TypeError
            record = object.__new__(cls)
            record.__dict__.update(zip(names, row, strict=True))
            if hasattr(record, "__post_init__"):
                record.__post_init__()
            return record
        if isinstance(row, Mapping):
            return cls(**{name: row[name] for name in _field_names(cls) if name in row})
        return cls(*row)


_NAMES: dict[type, tuple[str, ...]] = {}  # a record's field names, in order


def _field_names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


R = TypeVar("R")


def evolve(record: R, **changes: Any) -> R:
    """`dataclasses.replace` for a frozen record with no `__post_init__` nor cached properties,
    at a third of its cost: a copy of the instance's fields with `changes` (replace runs
    `__init__` again, one object.__setattr__ per field). For the planner's hot path: a Plan is
    copied once per gate."""
    kind = type(record)
    if not changes.keys() <= kind.__dataclass_fields__.keys():  # type: ignore[attr-defined]
        unknown = sorted(changes.keys() - kind.__dataclass_fields__.keys())  # type: ignore[attr-defined]
        raise TypeError(f"{kind.__name__} has no field(s) {', '.join(unknown)}")
    copy = object.__new__(kind)
    copy.__dict__.update(record.__dict__, **changes)
    return copy


@dataclass(frozen=True)
class Recipient(_FromRow):
    """A registered recipient, as the gates, the calendar and the send read it."""

    user_id: str
    timezone: str
    locale: str
    country: str | None
    org_id: str | None
    addresses: Mapping[str, str]
    quiet_start: time | None
    quiet_end: time | None
    workweek: tuple[int, ...] | None
    subdivision: str | None

    def __post_init__(self) -> None:
        # jsonb may hold null; a smallint[] comes back as a list
        object.__setattr__(self, "addresses", dict(self.addresses or {}))
        if self.workweek is not None:
            object.__setattr__(self, "workweek", tuple(self.workweek))


class PlannedRequest(Protocol):
    """What the gates read of a request: a resolved one, or a dry run's (which may have no id)."""

    @property
    def user_id(self) -> str: ...
    @property
    def id(self) -> int | None: ...
    @property
    def type_key(self) -> str: ...
    @property
    def occurrence_key(self) -> str: ...
    @property
    def variables(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class DraftRequest:
    """A request as a dry run plans it: not resolved, perhaps not even stored (`id` None)."""

    user_id: str
    id: int | None
    type_key: str
    occurrence_key: str
    variables: Mapping[str, Any]


@dataclass(frozen=True)
class ResolvedRequest(_FromRow):
    """A request this route task moved from pending to routed (resolve-once): it alone plans it."""

    user_id: str
    id: int
    type_key: str
    occurrence_key: str
    lane: str
    template_version: int
    variables: dict[str, Any]
    locale: str | None
    created_at: datetime

    @property
    def key(self) -> Key:
        return (self.user_id, self.id)


@dataclass(frozen=True)
class DueRequest(_FromRow):
    """A request the tick took to publish (never published, stray, or deferred until now)."""

    user_id: str
    id: int
    lane: str


@dataclass(frozen=True)
class CreatedDelivery(_FromRow):
    """A delivery row just inserted by the route task."""

    user_id: str
    id: int
    request_id: int
    channel: str
    lane: str
    held: bool  # not to be sent before its not_before
    lease_left: float | None  # inserted claimed: seconds its lease has left (PostgreSQL's clock)


@dataclass(frozen=True)
class ClaimedDelivery(_FromRow):
    """A delivery this worker holds the claim on, with what sending it needs."""

    user_id: str
    id: int
    request_id: int
    type_key: str
    occurrence_key: str
    channel: str
    lane: str
    attempts: int  # including this one
    taken_over: bool  # claimed from a lapsed lease
    maybe_sent_at: datetime | None  # an earlier attempt may have sent (from then on)
    last_error: str | None
    template_version: int
    variables: dict[str, Any]
    locale: str | None  # the recipient's locale, pinned on the request when it was made
    addresses: dict[str, Any]
    requested_at: datetime
    lease_left: float  # seconds, on PostgreSQL's clock, when the claim was made
    claimed_at: float = 0.0  # time.monotonic() when the claim statement answered

    @property
    def key(self) -> Key:
        return (self.user_id, self.id)

    @classmethod
    def inserted(
        cls,
        created: CreatedDelivery,
        request: ResolvedRequest,
        recipient: Recipient,
        *,
        claimed_at: float,
    ) -> ClaimedDelivery:
        """A delivery the route task inserted claimed, from the rows it has at hand (the claim
        statement's columns, without reading them again)."""
        return cls(
            created.user_id,
            created.id,
            created.request_id,
            request.type_key,
            request.occurrence_key,
            created.channel,
            created.lane,
            attempts=1,
            taken_over=False,
            maybe_sent_at=None,
            last_error=None,
            template_version=request.template_version,
            variables=request.variables,
            locale=request.locale,
            addresses=dict(recipient.addresses),
            requested_at=request.created_at,
            lease_left=created.lease_left or 0.0,
            claimed_at=claimed_at,
        )


# --- what the gates read about a recipient (gates.contract.Snapshot), per gate's db module ------


@dataclass(frozen=True)
class Preference(_FromRow):
    """One of a recipient's settings: scope (type | category | all), its key ('*' for all), the
    channel ('*': every channel) and whether it is on."""

    scope: str
    key: str
    channel: str
    enabled: bool


@dataclass(frozen=True)
class Suppression(_FromRow):
    """An address on the suppression list, listed for `user_id` (whoever else holds it)."""

    user_id: str
    channel: str
    address: str
    reason: str


@dataclass(frozen=True)
class HashedSuppression(_FromRow):
    """A suppression found by the keyed hash of an address about to be used (listed for anyone)."""

    user_id: str
    channel: str
    address_hash: str
    reason: str
    detail: str
    created_at: datetime


@dataclass(frozen=True)
class OpenWindow(_FromRow):
    """A recipient's open activation window: until when, and the type whose nudge opened it."""

    user_id: str
    until: datetime
    type_key: str


@dataclass(frozen=True)
class FatigueCount(_FromRow):
    """Slots taken under a fatigue cap: a scope (`user:<id>`, `org:<id>`) in one bucket."""

    scope: str
    bucket: str
    count: int


@dataclass(frozen=True)
class CollapseGroup(_FromRow):
    """An open collapse group: its leader request, when its window ends, members so far."""

    user_id: str
    key: str
    leader_id: int
    until: datetime
    count: int
