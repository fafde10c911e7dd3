"""A sending number's budget under real worker processes, counted at the local Twilio.

Four worker processes (two transactional workers, two processes each), a control worker and beat
send SMS to one sending number whose budget is CLARION_SMS_SEGMENTS_PER_SECOND=10 (clarion spends
9). Most texts are one segment, every tenth is two. Counted at the fake (standins/fake_twilio.py), by
arrival time: no second holds more than 10 segments, every message arrives exactly once, and a
429 storm in the middle pauses the number for every worker and is then recovered from. In the
ledger: every delivery sent on its first attempt (waiting for the budget refunds the attempt).

The full run (2,000 SMS, five to six minutes here) is `soak`; 150 run in the normal tier.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from clarion.standins.fake_twilio import FakeTwilio
from clarion.tasks import notify_many, register_recipient
from tests.support.cluster import Cluster, counts
from tests.support.pipeline import configure, publishing_to_this_tests_broker

pytestmark = pytest.mark.acceptance

CATALOG = Path(__file__).parents[1] / "catalog_sms.yaml"
RATE = 10
RETRY_AFTER = 2.0
IN_FLIGHT = 0.25  # seconds: requests already on their way when the first 429 is answered
WORKERS = ("transactional-1", "transactional-2", "control")
SHORT, LONG = "Your order shipped.", ("Your order shipped. " * 10).strip()  # 1 and 2 segments


def _number(n: int) -> str:
    return f"+4915{n:09d}"


@pytest.fixture
def cluster(clarion_env, monkeypatch, tmp_path: Path) -> Iterator[FakeTwilio]:
    configure(monkeypatch, catalog=CATALOG)
    with FakeTwilio() as fake, publishing_to_this_tests_broker():
        env = {
            **clarion_env.env,
            "CLARION_CATALOG": str(CATALOG),
            "CLARION_TICK_INTERVAL": "0.25",
            "CLARION_TWILIO_ACCOUNT_SID": FakeTwilio.ACCOUNT_SID,
            "CLARION_TWILIO_AUTH_TOKEN": FakeTwilio.AUTH_TOKEN,
            "CLARION_TWILIO_API_URL": fake.url,
            "CLARION_TWILIO_FROM": FakeTwilio.NUMBER,
            "CLARION_SMS_SEGMENTS_PER_SECOND": str(RATE),
        }
        logs = tmp_path / "logs"
        c = Cluster(env, logs)
        c.worker("transactional-1", ["transactional"], concurrency=2)
        c.worker("transactional-2", ["transactional"], concurrency=2)
        c.worker("control", ["control"], concurrency=1)
        c.beat()
        try:
            c.wait_ready(WORKERS, 60)
            yield fake
        finally:
            c.stop_together()


@pytest.mark.parametrize(
    "n",
    [pytest.param(150, id="150"), pytest.param(2000, id="2000", marks=pytest.mark.soak)],
)
def test_four_workers_keep_one_numbers_budget_drop_nothing_and_ride_out_a_429_storm(cluster, n):
    fake = cluster
    texts = {_number(i): LONG if i % 10 == 0 else SHORT for i in range(n)}
    for i in range(n):
        register_recipient(f"r{i}", timezone="UTC", addresses={"sms": _number(i)})
    started = time.monotonic()
    notify_many(
        [
            dict(user_id=f"r{i}", type_key="sms_receipt", event_id="e1", variables={"text": t})
            for i, t in enumerate(texts.values())
        ]
    )
    segments = sum(2 if t == LONG else 1 for t in texts.values())
    deadline = started + 60 + segments / (RATE * 0.9) * 2

    _wait(lambda: len(fake.messages()) >= n // 4, deadline, "a quarter of the messages")
    fake.storm(3, retry_after=RETRY_AFTER)  # mid-run: the next three requests get 429
    _wait(
        lambda: counts("SELECT count(*) FROM deliveries WHERE state = 'sent'") == n,
        deadline,
        "every delivery sent",
    )
    elapsed = time.monotonic() - started

    messages = fake.messages()
    arrived = Counter(m.to for m in messages)
    assert arrived == Counter(texts.keys()), "a message was dropped or sent twice"
    assert all(m.body == texts[m.to] for m in messages)
    assert sum(m.segments for m in messages) == segments  # 1 or 2 each, as the fake counts
    busiest = fake.segments_per_second()
    window = [round(m.arrived - fake.busiest_second()[0].arrived, 3) for m in fake.busiest_second()]
    assert busiest <= RATE, f"{busiest} segments arrived within one second: {window}"

    throttled = fake.throttled()
    assert len(throttled) == 3  # the storm was met, and nothing else was refused
    first = throttled[0].arrived
    # Sends that took the budget before the pause land with the 429s (one burst); nothing
    # taken later arrives until the pause has passed.
    during = [m.arrived - first for m in messages if IN_FLIGHT < m.arrived - first < RETRY_AFTER]
    assert during == [], f"a worker sent while the number was paused: {during}"
    assert any(m.arrived - first >= RETRY_AFTER for m in messages)  # and it recovered

    assert counts("SELECT count(*) FROM deliveries WHERE attempts <> 1") == 0
    assert counts("SELECT count(*) FROM deliveries WHERE state <> 'sent'") == 0
    assert counts("SELECT count(*) FROM incidents") == 0
    print(
        f"\n{n} SMS ({segments} segments) in {elapsed:.1f} s, busiest second {busiest}; "
        f"{segments / elapsed:.1f} segments/s"
    )


def _wait(done, deadline: float, what: str) -> None:
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")
