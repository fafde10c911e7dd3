"""The one exception root. Every error clarion raises on purpose is a ClarionError."""

from __future__ import annotations


class ClarionError(Exception):
    """Root of every error clarion raises deliberately."""


class ConfigurationError(ClarionError):
    """A setting or a catalog file is missing or malformed."""


class ServicesUnavailable(ConfigurationError):
    """No database/Redis URL is configured and no embedded services are running."""


class DependencyMissing(ClarionError):
    """A service the worker needs (broker, database) does not answer yet: transient, unlike a
    ConfigurationError. `missing` names each one and why."""

    def __init__(self, missing: dict[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {why}" for name, why in missing.items()))
        self.missing = missing


class InvalidRequest(ClarionError):
    """A notify() call that cannot be accepted. Nothing was written."""


class InvalidField(InvalidRequest):
    """One argument, or one part of it (`variables.items[2]`, `addresses.email`), is malformed.

    `field` names it as the caller wrote it; `reason` says what is wrong, without echoing more
    than a short excerpt of the value."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownType(InvalidRequest):
    """`catalog` names the catalog looked in: `/path/catalog.yaml (sha256 1a2b3c4d5e6f)`."""

    def __init__(self, type_key: str, catalog: str | None = None) -> None:
        where = f": not in catalog {catalog}" if catalog else ""
        super().__init__(f"unknown notification type {type_key!r}{where}")
        self.type_key = type_key
        self.catalog = catalog


class MissingVariables(InvalidRequest):
    def __init__(self, type_key: str, missing: list[str]) -> None:
        super().__init__(f"type {type_key!r} needs variables: {', '.join(sorted(missing))}")
        self.type_key = type_key
        self.missing = sorted(missing)


class UnknownEndpoint(ClarionError):
    """No app webhook endpoint has this id (tasks/event_endpoints.py)."""

    def __init__(self, endpoint_id: int) -> None:
        super().__init__(f"no webhook endpoint {endpoint_id}")
        self.endpoint_id = endpoint_id


class UnknownRecipient(InvalidRequest):
    def __init__(self, user_id: str) -> None:
        super().__init__(f"unknown recipient {user_id!r}")
        self.user_id = user_id


class UnknownTopic(InvalidField):
    """A broadcast to a topic nobody ever joined (a typo would otherwise reach nobody, silently)."""

    def __init__(self, topic: str, field: str = "audience.topic") -> None:
        super().__init__(field, f"unknown topic {topic[:80]!r}")
        self.topic = topic


class UnknownBroadcast(InvalidField):
    def __init__(self, broadcast_id: int, field: str = "broadcast_id") -> None:
        super().__init__(field, f"no broadcast {broadcast_id}")
        self.broadcast_id = broadcast_id


class NotInChain(InvalidRequest):
    """An acknowledgement for a request that belongs to no escalation chain (or does not exist)."""

    def __init__(self, user_id: str, request_id: int) -> None:
        super().__init__(f"request {request_id} of {user_id!r} belongs to no escalation chain")
        self.user_id, self.request_id = user_id, request_id


class SeriesConflict(InvalidRequest):
    """arm_series with a series key already armed with other options. Nothing was written: the
    existing series is kept as it was, and the caller decides (cancel it and arm again, or pass
    another series_key). `differences` maps each option to (armed, asked)."""

    def __init__(
        self, series_id: int, series_key: str, differences: dict[str, tuple[object, object]]
    ) -> None:
        shown = "; ".join(f"{k} {_shown(a)}, not {_shown(b)}" for k, (a, b) in differences.items())
        super().__init__(
            f"series {series_id} (key {series_key!r}) is already armed with {shown}: cancel it "
            "and arm again, or pass another series_key"
        )
        self.series_id = series_id
        self.series_key = series_key
        self.differences = differences


def _shown(value: object) -> str:
    iso = getattr(value, "isoformat", None)
    return repr(iso()) if callable(iso) else repr(value)


class InvalidTimezone(InvalidField):
    def __init__(self, zone: str, field: str = "timezone") -> None:
        super().__init__(field, f"not an IANA time zone: {str(zone)[:80]!r}")
        self.zone = zone


class InvalidOccurrence(InvalidField):
    """Both or neither of event_id / occurrence_key, an empty or malformed one, or a key with a
    reserved prefix (`series:` keys are written by series only)."""

    def __init__(self, reason: str, field: str = "occurrence_key") -> None:
        super().__init__(field, reason)


class SendError(ClarionError):
    """An adapter could not hand the message to its provider."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class TransientSendError(SendError):
    """Worth retrying: timeouts, 5xx, 429. retry_after is the provider's hint in seconds."""

    def __init__(self, reason: str, detail: str = "", retry_after: float | None = None) -> None:
        super().__init__(reason, detail)
        self.retry_after = retry_after


class PermanentSendError(SendError):
    """Retrying cannot help: 4xx, unknown address, template gone."""


class DeferredSendError(TransientSendError):
    """Nothing was attempted, and it should be later: the attempt is refunded and the delivery
    waits `retry_after` (e.g. a catalog version a newer worker has, a reconcile look-up that is
    rate-limited). The caller bounds how long."""


class ThrottledError(DeferredSendError):
    """Not sent because a rate limit said "not now" (clarion's own budget, or the provider's 429)."""


class UnknownSendError(SendError):
    """The third outcome: the request may have reached the provider, but no answer came back (a
    timeout or a 5xx after the request was written, a dropped connection, a send past its
    deadline). Never retried blindly: reconciled, resent under the provider's idempotency key, or
    held as `unknown` for an operator (tasks.send.outcomes decides, per channel and type)."""

    def __init__(self, reason: str, detail: str = "", retry_after: float | None = None) -> None:
        super().__init__(reason, detail)
        self.retry_after = retry_after


class FaultInjected(ClarionError):
    """Raised by a fault point switched on with the 'raise' action."""
