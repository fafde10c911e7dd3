"""A toy gate, the whole of it: requests go out on the recipient's local Monday to Friday only,
except a recipient's first contact (someone never sent anything), which goes out any day.

It shows the gate contract (gates.contract): a name and a pure plan step (`Gate`), and its own
rows read with the snapshot (`SnapshotPart`: how many deliveries each recipient has had), all
registered with one line: `register(GATE, before="quiet_hours", snapshot=GATE)`. A production
gate keeps its statement in a db/ module of its own, as the window, caps and collapse gates do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import Connection, text

from clarion.db.ledger import THESE_USERS
from clarion.gates.contract import Channels, Context, Plan, with_step
from clarion.rows import Recipient
from clarion.scheduling.zones import load_zone

_DELIVERIES = text(f"SELECT user_id, count(*) FROM deliveries {THESE_USERS} GROUP BY user_id")


@dataclass(frozen=True)
class WeekdayOnly:
    name: str = "weekday_only"

    def read(
        self, conn: Connection, recipients: Mapping[str, Recipient], now: datetime
    ) -> dict[str, int]:
        """Deliveries each recipient has had (0 for one never contacted), in one query."""
        rows = conn.execute(_DELIVERIES, {"users": list(recipients)})
        counted: dict[str, int] = {user: n for user, n in rows}
        return {user: counted.get(user, 0) for user in recipients}

    def plan(self, p: Plan, channels: Channels, c: Context) -> tuple[Plan, Channels]:
        local = c.now.astimezone(load_zone(c.recipient.timezone))
        if local.weekday() < 5:
            return with_step(p, self.name, "allow", "weekday"), channels
        if c.snapshot.part(self) == 0:  # None: this snapshot was read without the part
            return with_step(p, self.name, "allow", "first_contact", f"{local:%A}"), channels
        detail = f"{local:%A} in {c.recipient.timezone}"
        return replace(with_step(p, self.name, "suppress", "weekend", detail), channels=()), []


GATE = WeekdayOnly()
