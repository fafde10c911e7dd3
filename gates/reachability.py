"""Reachability: a channel needs an adapter, and the recipient an address on it when the adapter
needs one (chat and in-app reach the user id)."""

from __future__ import annotations

from clarion.gates.contract import ChannelContext, FunctionChannelGate, Step


def check(channel: str, c: ChannelContext) -> Step | None:
    if channel not in c.needs_address:
        return Step(
            "channel", "suppress", "no_adapter", f"no adapter for channel {channel!r}", channel
        )
    if c.needs_address[channel] and not c.recipient.addresses.get(channel):
        return Step(
            "channel", "suppress", "no_address", f"recipient has no {channel} address", channel
        )
    return None


GATE = FunctionChannelGate("channel", check)
