"""One channel over several providers, in order of preference (CLARION_EMAIL_PROVIDERS,
CLARION_SMS_PROVIDERS): the next is tried only when the one before it *certainly* did not take
the message, or its circuit (adapters.circuit, shared by every worker) is open.

| a provider's answer                                         | its circuit | then                       |
| ----------------------------------------------------------- | ----------- | -------------------------- |
| taken                                                       | success     | recorded as sent by it     |
| no connection, a 4xx SMTP reply (TransientSendError)        | failure     | the next provider, now     |
| 401 / 403: the account itself is refused                    | failure     | the next provider, now     |
| unknown (a 5xx, a timeout, a dropped answer)                | failure     | **no failover**: the outcome policy (tasks.send.outcomes) |
| refused for this message (a bad address, a 400)             | success     | failed, as without failover |
| throttled (its own budget full, a 429)                      | —           | deferred: its budget is respected, not spilled |
| circuit open (or a probe in flight)                         | —           | skipped: the next provider |

An unknown outcome never fails over within the attempt: the provider may have taken the message.
The row goes to the outcome policy as with one provider — held (at-most-once), resent after the
evidence wait (at-least-once: the resend goes to whichever provider is healthy then, with its
`possible_duplicate` incident), or reconciled. Reconciling asks every provider that can be asked
(each Twilio account's Messages list), since the attempt may have gone to any of them.

The recorded `platform` of a sent delivery is the provider's name (`sendgrid`, `smtp`,
`twilio_backup`…). A failover counts in `clarion_provider_failovers_total{channel, from, to}`;
each circuit's state is the gauge `clarion_provider_circuit_state` (0 closed, 1 half-open,
2 open). A circuit that opens opens a `provider_failover` alert for its provider (through the
`ProviderAlerts` collaborator); the probe that closes it clears the alert. Both follow the
circuit's transitions in Redis, which one worker makes each, so the fleet raises one alert.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from clarion import metrics
from clarion.adapters.base import Adapter
from clarion.adapters.circuit import GAUGE, Change, Circuits, State, reopens_in
from clarion.errors import (
    DeferredSendError,
    PermanentSendError,
    SendError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult

log = logging.getLogger(__name__)
# Permanent answers about the account, not the message: the next provider may well take it.
ACCOUNT_REFUSED = frozenset({"http_401", "http_403", "twilio_20003"})


class ProviderAlerts(Protocol):
    """Where a failover is reported (db.alerts behind it, kind `provider_failover`)."""

    def failed_over(self, channel: str, provider: str, detail: str) -> None: ...

    def recovered(self, channel: str, provider: str) -> None: ...


@dataclass(frozen=True)
class Provider:
    name: str  # as in CLARION_<CHANNEL>_PROVIDERS, and the `platform` a send records
    adapter: Adapter


def confirmed_failure(error: SendError) -> bool:
    """True if `error` proves the provider did not take the message and the next one may:
    nothing was attempted of it (no connection, a transient refusal), or the account was
    refused. Never an unknown outcome; never a throttle (the provider's budget says wait)."""
    if isinstance(error, UnknownSendError | DeferredSendError):
        return False
    if isinstance(error, TransientSendError):
        return True
    return isinstance(error, PermanentSendError) and error.reason in ACCOUNT_REFUSED


class FailoverAdapter:
    """A channel over `providers`, first preferred (see the module docstring)."""

    updates_in_place = False

    def __init__(
        self,
        channel: str,
        providers: Sequence[Provider],
        circuits: Circuits,
        alerts: ProviderAlerts | None = None,
    ) -> None:
        if len(providers) < 2:
            raise ValueError(f"{channel}: failover needs two providers or more")
        self.channel = channel
        self.providers = tuple(providers)
        self.circuits = circuits
        self.alerts = alerts
        adapters = [p.adapter for p in providers]
        self.needs_address = any(a.needs_address for a in adapters)
        self.dedups_by_key = all(a.dedups_by_key for a in adapters)
        self.evidence_wait = max(float(getattr(a, "evidence_wait", 0.0)) for a in adapters)
        self.replaces_on_device = all(getattr(a, "replaces_on_device", False) for a in adapters)
        if all(callable(getattr(a, "reconcile", None)) for a in adapters):
            self.reconcile = self._reconcile

    def _circuit(self, provider: Provider) -> str:
        return f"{self.channel}:{provider.name}"

    def send(self, message: Message) -> SendResult:
        """The first provider whose circuit admits the send and that takes the message."""
        passed: list[tuple[Provider, str]] = []  # providers skipped or failed, and why
        for provider in self.providers:
            change = self.circuits.admit(self._circuit(provider))
            self._show(provider, change)
            if not change.admitted:
                passed.append((provider, "circuit open"))
                continue
            try:
                result = provider.adapter.send(message)
            except SendError as error:
                if not isinstance(error, DeferredSendError):
                    ok = isinstance(error, PermanentSendError) and not confirmed_failure(error)
                    self._record(provider, ok=ok)
                if not confirmed_failure(error):
                    raise
                passed.append((provider, str(error)[:200]))
                continue
            self._record(provider, ok=True)
            if passed:
                self._failed_over(passed, provider, message)
            return replace(result, platform=provider.name)
        raise self._none_took(passed)

    def _none_took(self, passed: list[tuple[Provider, str]]) -> SendError:
        """Every provider was skipped (circuits open: nothing attempted, wait for a probe) or
        refused the message for certain (retried later)."""
        detail = "; ".join(f"{p.name}: {why}" for p, why in passed)[:300]
        if all(why == "circuit open" for _, why in passed):
            waits = []
            for p in self.providers:
                seen = self.circuits.read(self._circuit(p))
                waits.append(reopens_in(seen.after, seen.now, self.circuits.policy))
            return DeferredSendError("circuits_open", detail, retry_after=max(0.5, min(waits)))
        return TransientSendError("all_providers_failed", detail)

    def _record(self, provider: Provider, *, ok: bool) -> None:
        change = self.circuits.record(self._circuit(provider), ok)
        self._show(provider, change)
        if self.alerts is None or change.before.state is change.after.state:
            return
        if change.after.state is State.OPEN:
            detail = f"{self.circuits.policy.failures} failures in a row or a failed probe"
            self._report(self.alerts.failed_over, provider.name, detail)
            # A probe that closed the circuit meanwhile may have cleared before this opened:
            # the circuit (Redis) is the judge, so look again.
            if self.circuits.read(self._circuit(provider)).after.state is State.CLOSED:
                self._report(self.alerts.recovered, provider.name)
        elif change.after.state is State.CLOSED:
            self._report(self.alerts.recovered, provider.name)

    def _show(self, provider: Provider, change: Change) -> None:
        if change.before.state is not change.after.state:
            metrics.CIRCUIT.labels(self.channel, provider.name).set(GAUGE[change.after.state])
            log.warning(
                "%s circuit of %s: %s -> %s",
                self.channel,
                provider.name,
                change.before.state,
                change.after.state,
                extra={
                    "action": "circuit_changed",
                    "provider": provider.name,
                    "state": str(change.after.state),
                },
            )

    def _failed_over(
        self, passed: list[tuple[Provider, str]], to: Provider, message: Message
    ) -> None:
        first = passed[0][0]
        metrics.FAILOVERS.labels(self.channel, first.name, to.name).inc()
        log.warning(
            "failed over from %s to %s",
            first.name,
            to.name,
            extra={"action": "provider_failover", "delivery": message.delivery_id},
        )

    def _report(self, call: Callable[..., None], provider: str, *detail: str) -> None:
        """An alert is best effort: the message was taken, and an error raised now would make
        its outcome look unknown."""
        try:
            call(self.channel, provider, *detail)
        except Exception:
            log.exception("failover alert not recorded", extra={"action": "failover_alert_lost"})

    def _reconcile(self, message: Message, since: datetime) -> SendResult | None:
        """An earlier attempt's message, asked of every provider (it may have gone to any):
        found by one → sent by it; not found by all, conclusively → None; otherwise the first
        provider's error (TransientSendError: ask later; UnknownSendError: cannot tell)."""
        errors: list[SendError] = []
        for provider in self.providers:
            try:
                found = provider.adapter.reconcile(message, since)  # type: ignore[attr-defined]
            except SendError as error:
                errors.append(error)
                continue
            if found is not None:
                return replace(found, platform=provider.name)
        if errors:
            transient = [e for e in errors if not isinstance(e, UnknownSendError)]
            raise (transient or errors)[0]
        return None
