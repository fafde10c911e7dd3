"""Lanes hold by default (issue 28 item 5), the seed's campaign case: a 200,000-recipient marketing
broadcast drains through the email channel at a provider budget while transactional receipts go
out at 10/s, every process on one host, with the documented workers and no rate set by anyone.
The receipts' p95 notify→provider (arrival at the SendGrid stand-in minus the notify call) under
the campaign must be at most 1.5× the idle p95 of the same run (measured before the campaign and
after it); every campaign recipient gets one
mail, and each lane mails from its own identity (from-address and IP pool).

SOAK_CAMPAIGN_SIZE sets a smaller audience for a quick look (the figures for 20,000 on a
shared 2-core host are in bench/RESULTS.md)."""

from __future__ import annotations

import os
import time

import pytest

from tests.support.campaign import (
    MK_FROM,
    MK_POOL,
    TX_FROM,
    TX_POOL,
    Receipts,
    StandIn,
    audience,
    drain_rate,
    drained,
    email_env,
    p95,
    start_campaign,
    start_lanes,
    wait_for,
)
from tests.support.cluster import Cluster
from tests.support.environment import reset_process_state

# Not in the soak tier CI runs yet: a failing CI lands nothing, and the ratio is not yet shown
# with room to spare on every machine. On a quiet 2-core host, 2.22x at first; 1.46x and 1.80x
# once beat analyzed tables that outgrew their statistics; 1.32x and 0.88x with bulk sends one at
# a time beside receipts; on a slower host losing 22-30% of its CPU to steal, 2.87x, then 1.63x
# with the bulk worker's session niced. Session 29 (fast host, 1,200 latencies each side): 1.40x,
# 1.38x, then with the bulk worker's database backends niced where it counts (their sessions) and
# SendGrid mail on kept-alive connections 1.25x, 1.36x and 1.53x (idle p95 8.0 ms: the few ms the
# campaign adds weigh more the faster the idle path) (bench/RESULTS.md, "Lanes under a
# campaign"). Issue 28 stays open until this passes reliably. `make campaign`.
pytestmark = [pytest.mark.acceptance, pytest.mark.campaign]

SIZE = int(os.environ.get("SOAK_CAMPAIGN_SIZE", "200000"))
# The lanes' settings a run asks for (`CLARION_BULK_FEEDBACK=on make campaign`), read before the
# clarion_env fixture removes every CLARION_* variable it did not set itself (until session 29
# they were silently dropped: the runs recorded as "with the feedback on" ran the defaults).
ASKED = {k: v for k, v in os.environ.items() if k.startswith("CLARION_BULK_")}
# Receipts per second and seconds of the phase beside the campaign (the idle baseline is two
# phases of half that, before and after): 1,200 latencies each side, so that a p95 is the 60th
# slowest and not the 15th, which one stall of the host can move on its own.
RATE, SECONDS = 20.0, 60.0
PER_SECOND = 2000  # the provider's budget (clarion spends 90%, the activation lane half of it)


@pytest.mark.timeout(3600)  # the campaign alone drains in about 9 minutes on 2 cores
def test_receipts_keep_their_p95_while_a_200k_campaign_drains(clarion_env, tmp_path, monkeypatch):
    stand_in = StandIn()
    try:
        env = {
            **clarion_env.env,
            **ASKED,
            **email_env(stand_in.url, stand_in.api_key, PER_SECOND),
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        reset_process_state()
        users = audience(SIZE)
        cluster = Cluster(env, tmp_path / "logs")
        try:
            start_lanes(cluster)
            receipts = Receipts(stand_in)
            receipts.steady(RATE, 3)  # warm-up: every pool process has its connections
            before = receipts.steady(RATE, SECONDS / 2)
            began = time.monotonic()
            start_campaign("idle-then-busy")
            wait_for(lambda: stand_in.campaign_count() >= min(2000, SIZE // 10), 600, "campaign")
            bulk_idle = drain_rate(stand_in, 5)  # no receipts meanwhile
            phase = time.monotonic()
            busy = receipts.steady(RATE, SECONDS)
            ended = time.monotonic()
            drained(stand_in, SIZE, 3 * 3600)
            # idle again: the baseline is both sides of the campaign, so a host whose other load
            # drifts during the run does not tilt the ratio either way
            idle = sorted(before + receipts.steady(RATE, SECONDS / 2))
        finally:
            cluster.stop_together()
        got = stand_in.close()
    finally:
        stand_in.kill()
    during = sum(1 for t in got.campaign_at if phase <= t <= ended)
    assert max(got.campaign_at) > ended, "the campaign was over before the receipts' phase ended"
    ratio = p95(busy) / p95(idle)
    print(
        f"\ncampaign of {SIZE:,} at a {PER_SECOND}/s provider budget: receipts p95 idle "
        f"{p95(idle) * 1000:.1f} ms, under the campaign {p95(busy) * 1000:.1f} ms = {ratio:.2f}x; "
        f"campaign {bulk_idle:,.0f}/s with receipts idle, {during / (ended - phase):,.0f}/s "
        f"beside them; whole campaign {max(got.campaign_at) - began:,.0f} s; settings asked: "
        f"{' '.join(f'{k}={v}' for k, v in sorted(ASKED.items())) or 'none (the defaults)'}"
    )
    for name, values in (("idle", idle), ("campaign", busy)):
        print(
            f"  {name}: p50 {values[len(values) // 2] * 1000:.1f} ms, p95 "
            f"{p95(values) * 1000:.1f} ms, max {values[-1] * 1000:.1f} ms, n={len(values)}"
        )
    assert ratio <= 1.5, f"receipts' p95 {ratio:.2f}x idle under the campaign"
    assert set(got.campaign_to) == {f"{u}@example.test" for u in users}
    assert max(got.campaign_to.values()) == 1, "a campaign recipient mailed twice"
    assert got.campaign_identities == {(MK_FROM, MK_POOL)}
    assert {(sender, pool) for _, sender, pool in got.receipts.values()} == {(TX_FROM, TX_POOL)}
