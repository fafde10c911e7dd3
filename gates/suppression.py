"""The suppression list: a bounced, complained-about or STOPped address is never used again,
whoever holds it (the snapshot matches everyone's rows by the address's keyed hash)."""

from __future__ import annotations

from collections.abc import Mapping

from clarion.gates.contract import ChannelContext, FunctionChannelGate, Step


def check(channel: str, c: ChannelContext) -> Step | None:
    address = c.recipient.addresses.get(channel) or c.recipient.user_id
    why = suppressed(channel, address, c.snapshot.suppressed)
    if why is None:
        return None
    detail = f"{channel} address is on the suppression list ({why})"
    return Step("suppression", "suppress", "suppressed_address", detail, channel)


def suppressed(channel: str, address: str, listed: Mapping[tuple[str, str], str]) -> str | None:
    """The suppression reason that stops `address` on `channel`, or None. A push address is a
    list of devices: it is stopped only when every device is listed."""
    if channel == "push":
        reasons = [listed.get((channel, device)) for device in address.split()]
        return None if not reasons or None in reasons else reasons[0]
    return listed.get((channel, address))


GATE = FunctionChannelGate("suppression", check)
