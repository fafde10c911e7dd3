"""What every channel adapter takes and returns. Adapters are thin: build the payload, do the I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from clarion.errors import SendError
from clarion.records import Message, SendResult

if TYPE_CHECKING:
    import redis as redis_lib

    from clarion.adapters.circuit import Circuits
    from clarion.adapters.failover import ProviderAlerts
    from clarion.adapters.http1 import Connections
    from clarion.adapters.inapp import InboxStore
    from clarion.adapters.ratelimit import Quota, RateLimits
    from clarion.adapters.teams import ReferenceStore


class Adapter(Protocol):
    """A channel. Three outcomes of `send`: a SendResult (sent), TransientSendError or
    PermanentSendError (failed: the provider did not take it), UnknownSendError (it may have).

    `dedups_by_key`: the provider drops a second request with the same idempotency key, so a send
    with an unknown outcome may be repeated under that key. `evidence_wait` (optional, seconds):
    the provider reports back naming the delivery (a status callback, an event), and such a
    report settles an unknown outcome as sent (db.receipts): a resend waits this long for one.
    `replaces_on_device` (optional): a resend carries the same collapse id and replaces the first
    on the device instead of adding a second (push), so an at-most-once type may be resent. A channel that can look for its own
    earlier message also has `reconcile(message, since) -> SendResult | None` (see ChatAdapter)."""

    channel: str
    needs_address: bool
    dedups_by_key: bool

    def send(self, message: Message) -> SendResult:
        """Hand the message to the provider."""
        ...


class SendsMany(Adapter, Protocol):
    """A channel that puts several calls in flight at once (`sends_many`: the webhook's requests
    on kept-alive connections); see `Channel.send_many`."""

    sends_many: bool

    def send_many(self, messages: list[Message]) -> list[SendResult | SendError]:
        """Each message's outcome, in order: its SendResult, or the SendError it ended in."""
        ...


class ChatAdapter(Adapter, Protocol):
    """Channels with buttons (Slack, Teams) also update a sent message in place (see
    `Channel.update`), and may find a message an earlier, crashed attempt already posted."""

    updates_in_place: bool

    def update(
        self, message: Message, provider_message_id: str, answered: str | None = None
    ) -> None:
        """Re-render the sent message; `answered` is the catalog label of the recorded answer."""
        ...

    def reconcile(self, message: Message, since: datetime) -> SendResult | None:
        """The message an earlier attempt (started at or after `since`) posted, if the provider
        has it; None if it does not. TransientSendError: the provider cannot be asked now."""
        ...


# --- collaborators: what the composition root (tasks.runtime) hands an adapter ---------------------


class Suppressions(Protocol):
    """The permanent suppression list, as adapters may touch it (db.gating behind it)."""

    def suppress(self, user_id: str, channel: str, address: str, reason: str, detail: str) -> None:
        """Never use this address on this channel again (bounced, STOP, invalid token, gone)."""
        ...

    def forget_address(self, user_id: str, channel: str, value: str) -> None:
        """Remove one value (a push token) from the recipient's address for `channel`."""
        ...


@dataclass(frozen=True)
class Collaborators:
    """Everything an adapter may need from outside itself. Adapters never import db/ or tasks/:
    tasks.runtime builds this once per process and passes it to each adapter's factory
    (`from_settings(settings, collaborators)`, named in adapters/registry.py)."""

    redis: Callable[[], redis_lib.Redis]
    limits: RateLimits
    suppressions: Suppressions
    references: ReferenceStore  # Teams conversation references (db.teams), and gone bots
    inbox: InboxStore  # the in-app inbox (db.inbox)
    http: Connections  # the process's kept-alive HTTP/1.1 connections (webhook)
    circuits: Circuits  # every provider's health, shared by the fleet (adapters.circuit)
    alerts: ProviderAlerts  # where a provider failover is reported (db.alerts)


# --- the channel template ---------------------------------------------------------------------------

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class Channel(Generic[Req, Resp]):
    """The shape every adapter follows (adapters/webhook.py is the model):

    - `to_request(message)`: pure; the provider request (raise PermanentSendError for a message
      that can never be sent: no address, too long).
    - `budget(message, request)`: (Quota, key, cost) to spend from the shared rate limits before
      the call, or None. `spend(message, request)` spends it; a channel whose budget is more than
      one take (SMS: a long message's overflow and a full budget's settle pause; push: one budget
      per provider; Teams: a short wait slept) overrides `spend`, not `send`.
    - `call(request)`: the I/O, nothing else; network errors become TransientSendError (the
      request cannot have left) or UnknownSendError (it may have).
    - `from_response(message, response)`: pure; a SendResult, or the SendError to raise.

    `send` strings them together; a channel overrides a step, not `send`.

    Optional capability, `update(message, provider_message_id, answered=None)`: re-render a
    message this channel sent, in place (Slack chat.update, a Teams card refresh). A channel that
    implements it sets `updates_in_place = True`; tasks.refresh then keeps a collapse leader's
    message showing its group's running count. Without it the channel keeps what it sent."""

    channel: str
    needs_address: bool = True
    dedups_by_key: bool = False
    evidence_wait: float = 0.0  # seconds a resend after an unknown outcome waits for a report
    replaces_on_device: bool = False  # a resend replaces the first on the device (push)
    updates_in_place: bool = False
    sends_many: bool = False  # call_many puts several calls in flight at once (send_many)
    limits: RateLimits | None = None

    def to_request(self, message: Message) -> Req:
        raise NotImplementedError

    def budget(self, message: Message, request: Req) -> tuple[Quota, str, int] | None:
        return None

    def call(self, request: Req) -> Resp:
        raise NotImplementedError

    def from_response(self, message: Message, response: Resp) -> SendResult:
        raise NotImplementedError

    def update(
        self, message: Message, provider_message_id: str, answered: str | None = None
    ) -> None:
        """Set the sent message `provider_message_id` (as the send recorded it) to `message`'s
        content, with the catalog label `answered` in place of its buttons if answered. Raises
        SendErrors as `send` does (ThrottledError: the channel's budget says wait). An update
        sets the whole message, so repeating one is harmless (at-least-once is fine)."""
        raise NotImplementedError(f"channel {self.channel!r} cannot update a sent message")

    def call_many(self, requests: list[Req]) -> list[Resp | SendError]:
        """Optional (a channel that sets `sends_many`): the calls of several requests in flight
        at once, each ending in its response or its SendError, in the order given."""
        raise NotImplementedError(f"channel {self.channel!r} makes one call at a time")

    def spend(self, message: Message, request: Req) -> None:
        """Spend `budget` from the shared rate limits (ThrottledError: wait, nothing was sent)."""
        spend = self.budget(message, request)
        if spend is not None and self.limits is not None:
            quota, key, cost = spend
            self.limits.take(quota, key, cost=cost, lane=message.lane)

    def send(self, message: Message) -> SendResult:
        """The sequence every channel follows: to_request → spend → call → from_response."""
        request = self.to_request(message)
        self.spend(message, request)
        return self.from_response(message, self.call(request))

    def send_many(self, messages: list[Message]) -> list[SendResult | SendError]:
        """`send` for several messages, their calls in flight together (`call_many`); each
        message's outcome in the order given, a SendError returned rather than raised."""
        outcomes: dict[int, SendResult | SendError] = {}
        ready: list[tuple[int, Req]] = []
        for i, message in enumerate(messages):
            try:
                request = self.to_request(message)
                self.spend(message, request)
            except SendError as error:
                outcomes[i] = error
            else:
                ready.append((i, request))
        responses = self.call_many([request for _, request in ready]) if ready else []
        for (i, _), response in zip(ready, responses, strict=True):
            try:
                if isinstance(response, SendError):
                    raise response
                outcomes[i] = self.from_response(messages[i], response)
            except SendError as error:
                outcomes[i] = error
        return [outcomes[i] for i in range(len(messages))]


def can_update(adapter: object) -> bool:
    """Whether the adapter implements the in-place `update` capability (Channel.update)."""
    return bool(getattr(adapter, "updates_in_place", False)) and callable(
        getattr(adapter, "update", None)
    )
