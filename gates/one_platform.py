"""One platform: a type marked `one_platform` (chat nudges) goes out on the first channel left."""

from __future__ import annotations

from clarion.gates.contract import ChannelContext, FunctionChannelGate, Step


def check(channel: str, c: ChannelContext) -> Step | None:
    if not (c.ntype.one_platform and c.chosen):
        return None
    return Step(
        "one_platform", "suppress", "other_platform", f"sent on {c.chosen[0]} instead", channel
    )


GATE = FunctionChannelGate("one_platform", check)
