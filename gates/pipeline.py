"""The planner: ordered gates over a snapshot, returning a Plan. No side effects; tasks apply it.

Today the pipeline has the gates the send ledger needs (catalog, reachability, one-platform);
preferences, quiet hours, the activation window and caps slot in here in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from catalog import NotificationType


@dataclass(frozen=True)
class Verdict:
    gate: str
    outcome: str  # suppress | defer | collapse | digest
    reason: str
    detail: str = ""
    channel: str | None = None


@dataclass(frozen=True)
class Plan:
    channels: tuple[str, ...] = ()
    verdicts: tuple[Verdict, ...] = field(default_factory=tuple)

    @property
    def delivers(self) -> bool:
        return bool(self.channels)


def plan(request: Mapping[str, Any], ntype: NotificationType | None,
         recipient: Mapping[str, Any] | None, *, now: datetime,
         needs_address: Mapping[str, bool]) -> Plan:
    """Decide which channels one request goes to, and why the others do not."""
    if ntype is None:
        return Plan(verdicts=(Verdict("catalog", "suppress", "unknown_type",
                                      f"type {request['type_key']!r} is not in the catalog"),))
    if recipient is None:
        return Plan(verdicts=(Verdict("recipient", "suppress", "unknown_recipient"),))
    addresses = recipient.get("addresses") or {}
    channels: list[str] = []
    verdicts: list[Verdict] = []
    for channel in ntype.channels:
        if channel not in needs_address:
            verdicts.append(Verdict("channel", "suppress", "no_adapter",
                                    f"no adapter for channel {channel!r}", channel))
        elif needs_address[channel] and not addresses.get(channel):
            verdicts.append(Verdict("channel", "suppress", "no_address",
                                    f"recipient has no {channel} address", channel))
        elif ntype.one_platform and channels:
            verdicts.append(Verdict("one_platform", "suppress", "other_platform",
                                    f"sent on {channels[0]} instead", channel))
        else:
            channels.append(channel)
    return Plan(tuple(channels), tuple(verdicts))
