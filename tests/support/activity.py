"""One recipient with four stories, made through the real pipeline on a frozen clock, for the
activity page and its query module (db/activity.py): a receipt sent on webhook and then bounced
(a receipt from the provider, through tasks.receipts.ingest), the next receipt stopped because the
address is now suppressed, a tip deferred by the recipient's quiet hours, and a Teams nudge whose
answer the connector dropped, held as unknown. Counted where it matters: the webhook receiver got
one message, the connector one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clarion.adapters.teams import ConversationRef
from clarion.records import Receipt
from clarion.standins.fake_connector import FakeConnector
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.receipts import ingest
from clarion.tasks.route import route
from tests.support.pipeline import (
    configure,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

CATALOG = Path(__file__).parents[1] / "catalog_timeline.yaml"
MONDAY = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)  # 04:00 in New York: inside ann's quiet hours
HOOK = "https://hooks.example/ann"
BOUNCE = "550 5.1.1 no such user"


@dataclass(frozen=True)
class Stories:
    bounced: int  # request ids
    suppressed: int
    deferred: int
    unknown: int


def _routed(type_key: str, event_id: str) -> int:
    made = notify("ann", type_key, event_id=event_id)
    assert route(["ann"], [made.request_id]) == 1
    drain("transactional"), drain("activation")
    return made.request_id


@contextmanager
def four_stories(secret: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stories]:
    """ann's four stories, the clock frozen at MONDAY (and the servers up) while in use."""
    with (
        Receiver(secret) as receiver,
        FakeConnector() as connector,
        frozen_clock(MONDAY),
        publishing_to_this_tests_broker(),
    ):
        configure(
            monkeypatch,
            catalog=CATALOG,
            webhook_url=receiver.url,
            teams_app_id="none",
            webhook_timeout=1,
            send_timeout=3,
        )
        ref = ConversationRef(connector.url, "a:1conversation", "tenant-1", "bot").to_json()
        register_recipient(
            "ann",
            timezone="America/New_York",
            quiet_hours=("22:00", "07:00"),
            addresses={"webhook": HOOK, "teams": "29:ann", "teams_conversation": ref},
        )
        bounced = _routed("receipt_webhook", "order-1")
        [sent] = rows("SELECT provider_message_id FROM deliveries WHERE request_id = :r", r=bounced)
        report = Receipt(
            channel="webhook",
            event="bounced",
            provider_message_id=sent["provider_message_id"],
            occurred_at=MONDAY,
            detail=BOUNCE,
        )
        assert ingest([report]) == {"applied": 1}
        suppressed = _routed("receipt_webhook", "order-2")
        deferred = _routed("tip_inapp", "tip-1")
        connector.losses.next("drop")
        unknown = _routed("nudge_teams", "nudge-1")
        assert receiver.arrivals.total == 1 and len(connector.sent) == 1  # counted at the servers
        yield Stories(bounced, suppressed, deferred, unknown)
