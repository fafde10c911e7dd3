"""A toy gate, the whole of it: requests go out on the recipient's local Monday to Friday only.

It shows the gate contract (gates.contract.Gate): a name, a pure plan step over the request's
context, registered with one line (`register(WeekdayOnly(), before="quiet_hours")`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from clarion.gates.contract import Channels, Context, Plan, with_step
from clarion.scheduling.zones import load_zone


@dataclass(frozen=True)
class WeekdayOnly:
    name: str = "weekday_only"

    def plan(self, p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
        local = c.now.astimezone(load_zone(c.recipient.timezone))
        if local.weekday() < 5:
            return with_step(p, self.name, "allow", "weekday"), channels
        detail = f"{local:%A} in {c.recipient.timezone}"
        return replace(with_step(p, self.name, "suppress", "weekend", detail), channels=()), []
