"""The seed's campaign case, measured at the receiving server (issue 28 item 5): a marketing
broadcast drains through the email channel (a FakeSendGrid in a process of its own, so its flood
shares no GIL with the producer being timed) at a provider budget, while transactional receipts
go out at a steady rate; a receipt's latency is its arrival at the stand-in minus the moment its
notify() began (both CLOCK_MONOTONIC, one host). Used by tests/acceptance/test_lanes_hold.py
(soak) and bench/lanes.py (the same run with and without the lanes' feedback)."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sqlalchemy import text

from clarion.db.engine import engine
from clarion.tasks import notify
from clarion.tasks.audiences import MAX_IDS, subscribe
from clarion.tasks.broadcasts import Started, broadcast
from tests.support.cluster import Cluster, wait_settled
from tests.support.environment import ROOT

CATALOG = ROOT / "tests" / "catalog_lanes.yaml"
TX_FROM, MK_FROM = "notify@tx.clarion.test", "news@mk.clarion.test"
TX_POOL, MK_POOL = "transactional-pool", "marketing-pool"
RECEIPT_USERS = 50


def email_env(url: str, api_key: str, per_second: int) -> dict[str, str]:
    """The settings that send both lanes' email through the stand-in, each with its identity."""
    return {
        "CLARION_CATALOG": str(CATALOG),
        "CLARION_SENDGRID_API_KEY": api_key,
        "CLARION_SENDGRID_API_URL": url,
        "CLARION_EMAIL_FROM": f"Clarion <{TX_FROM}>",
        "CLARION_EMAIL_FROM_MARKETING": f"Clarion News <{MK_FROM}>",
        "CLARION_SENDGRID_IP_POOL": TX_POOL,
        "CLARION_SENDGRID_IP_POOL_MARKETING": MK_POOL,
        "CLARION_PUBLIC_URL": "https://clarion.example",
        "CLARION_EMAIL_PER_SECOND": str(per_second),
    }


@dataclass
class Arrivals:
    """What the stand-in took: receipts by subject (arrival, from, ip pool), and the campaign's
    arrival times and recipients."""

    receipts: dict[str, tuple[float, str, str | None]] = field(default_factory=dict)
    campaign_at: list[float] = field(default_factory=list)
    campaign_to: Counter[str] = field(default_factory=Counter)
    campaign_identities: set[tuple[str, str | None]] = field(default_factory=set)


def _summary(sent: list[Any]) -> Arrivals:
    out = Arrivals()
    for s in sent:
        subject = str(s.payload.get("subject") or s.payload["personalizations"][0].get("subject"))
        sender, pool = s.payload["from"]["email"], s.payload.get("ip_pool_name")
        if subject.startswith("Receipt "):
            out.receipts.setdefault(subject, (s.arrived, sender, pool))
        else:
            out.campaign_at.append(s.arrived)
            out.campaign_to[s.to] += 1
            out.campaign_identities.add((sender, pool))
    return out


def _serve(conn: Connection) -> None:
    """The stand-in's process: answers "count" (campaign mails taken), "receipts" (the receipts'
    arrivals so far) and "stop" (everything, then it exits)."""
    from clarion.standins.fake_sendgrid import FakeSendGrid

    _no_long_pauses()
    with FakeSendGrid() as sendgrid:
        conn.send((sendgrid.url, FakeSendGrid.API_KEY))
        while (asked := conn.recv()) != "stop":
            with sendgrid.lock:
                sent = list(sendgrid.sent)
            if asked == "count":
                conn.send(sum(1 for s in sent if not s.payload["subject"].startswith("Receipt")))
            else:
                conn.send(_summary(sent).receipts)
        with sendgrid.lock:
            conn.send(_summary(list(sendgrid.sent)))


def _no_long_pauses() -> None:
    """Keep the stand-in's garbage collector off what it has taken: every mail it keeps is a
    parsed payload the collector would otherwise walk in full, in pauses that grow with the
    campaign (tens of ms at 40,000) and hold up the receipt that arrives meanwhile; a real
    provider's pauses are not ours to measure. Once a second what has survived is frozen
    (`gc.freeze`), so a collection looks only at what came since."""
    import gc
    import threading

    def freeze() -> None:
        while True:
            time.sleep(1.0)
            gc.freeze()

    threading.Thread(target=freeze, daemon=True).start()


class StandIn:
    """A FakeSendGrid in a child process."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        self.url, self.api_key = self.conn.recv()

    def campaign_count(self) -> int:
        self.conn.send("count")
        count: int = self.conn.recv()
        return count

    def receipts(self) -> dict[str, tuple[float, str, str | None]]:
        self.conn.send("receipts")
        got: dict[str, tuple[float, str, str | None]] = self.conn.recv()
        return got

    def close(self) -> Arrivals:
        self.conn.send("stop")
        got: Arrivals = self.conn.recv()
        self.process.join(10)
        return got

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()


def audience(size: int, topic: str = "campaign") -> list[str]:
    """`size` US recipients with email addresses, subscribed to `topic`, and RECEIPT_USERS
    receipt recipients (setup, not under test: one statement each)."""
    with engine().begin() as conn:
        for prefix, n in (("mk", size), ("tx", RECEIPT_USERS)):
            conn.execute(
                text(
                    """
                    INSERT INTO recipients (user_id, timezone, locale, country, addresses,
                                            created_at, updated_at)
                    SELECT :p || lpad(g::text, 7, '0'), 'America/New_York', 'en', 'US',
                           jsonb_build_object('email', :p || lpad(g::text, 7, '0')
                                              || '@example.test'), now(), now()
                    FROM generate_series(0, :n - 1) g
                    """
                ),
                {"p": prefix, "n": n},
            )
    users = [f"mk{g:07d}" for g in range(size)]
    for start in range(0, size, MAX_IDS):
        subscribe(topic, users[start : start + MAX_IDS])
    return users


class Receipts:
    """Transactional receipts at a steady rate, one notify() each, timed from the call."""

    def __init__(self, stand_in: StandIn, tag: str = "r") -> None:
        self.stand_in, self.tag = stand_in, tag  # the tag keeps rounds' events apart
        self.sequence = 0
        self.started: dict[str, float] = {}  # each receipt's order -> its notify() call (monotonic)

    def steady(self, rate: float, seconds: float, timeout: float = 120) -> list[float]:
        """Send receipts at `rate`/s for `seconds`; their latencies (s), sorted, once all came."""
        due: dict[str, float] = {}
        began = time.monotonic()
        for n in range(max(1, round(rate * seconds))):
            time.sleep(max(0.0, began + n / rate - time.monotonic()))
            j, self.sequence = self.sequence, self.sequence + 1
            at = time.monotonic()
            notify(
                f"tx{j % RECEIPT_USERS:07d}",
                "receipt_email",
                event_id=f"{self.tag}{j}",
                variables={"order": f"{self.tag}{j}"},
            )
            due[f"Receipt {self.tag}{j}"] = self.started[f"{self.tag}{j}"] = at
        got = wait_for(lambda: _all_in(self.stand_in.receipts(), due), timeout, "receipts")
        return sorted(got[k][0] - t for k, t in due.items())


def _all_in(
    got: dict[str, tuple[float, str, str | None]], due: dict[str, float]
) -> dict[str, tuple[float, str, str | None]] | None:
    return got if all(k in got for k in due) else None


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """The first truthy answer of `check`, polled; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}: not there after {timeout} s")


def p95(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.95 * len(values)))]


def start_lanes(
    cluster: Cluster, bulk_env: dict[str, str] | None = None, *, concurrency: int = 2
) -> None:
    """One worker per lane as the docs run them on one host, and beat; the bulk worker with
    `bulk_env` over the cluster's environment, and `concurrency` pool processes."""
    cluster.worker("tx", ["transactional"], concurrency=2)
    cluster.worker("bulk", ["activation"], concurrency=concurrency, env=bulk_env)
    cluster.worker("ctl", ["control", "events"], concurrency=1)
    cluster.beat()
    cluster.wait_ready(["tx", "bulk", "ctl"], 120)


def start_campaign(issue: str, topic: str = "campaign") -> Started:
    return broadcast("newsletter_email", {"topic": topic}, {"issue": issue})


def drain_rate(stand_in: StandIn, seconds: float) -> float:
    """Campaign mails taken per second over the next `seconds` (nothing else is sent)."""
    before, began = stand_in.campaign_count(), time.monotonic()
    time.sleep(seconds)
    return (stand_in.campaign_count() - before) / (time.monotonic() - began)


def logs_of(tmp: Path) -> Path:
    return tmp / "logs"


def drained(stand_in: StandIn, size: int, timeout: float) -> None:
    """Wait until the stand-in took the whole campaign, or the ledger has nothing left to send
    (a send whose outcome is unknown is not sent again: the count then stays short, and the
    caller's assertions say so); AssertionError after `timeout`."""
    wait_for(
        lambda: stand_in.campaign_count() >= size or wait_settled(1.0),
        timeout,
        "the whole campaign",
    )
