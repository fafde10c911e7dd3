"""Preferences as a channel gate: the recipient's settings (gates/preferences.py resolves them)
drop an opted-out channel; an allowed one records the rule that allowed it."""

from __future__ import annotations

from clarion.gates import preferences
from clarion.gates.contract import ChannelContext, FunctionChannelGate, Step


def check(channel: str, c: ChannelContext) -> Step | None:
    pref = preferences.resolve(c.ntype, channel, c.snapshot.preferences, c.country)
    outcome, reason = ("allow", "allowed") if pref.enabled else ("suppress", "opted_out")
    return Step("preferences", outcome, reason, pref.source, channel)


GATE = FunctionChannelGate("preferences", check)
