"""Lanes under a campaign (issue 28 item 5): receipts' p95 and the campaign's rate, with and without
the bulk lanes' feedback, in one run.

    .venv/bin/python bench/lanes.py [--size 20000] [--rounds off,advice,on]

Each round starts the documented workers afresh on one host (tx, bulk, control, beat;
tests/support/campaign.py) with email through a FakeSendGrid in its own process at a provider
budget, then: receipts at 10/s idle; a marketing broadcast to --size recipients; the campaign's
rate with receipts idle (--drain seconds); receipts at 10/s beside it; the rest of the campaign;
receipts idle again. Latency: arrival at the stand-in minus the notify call.

  off     CLARION_BULK_FEEDBACK=off, CLARION_BULK_NICE=0, CLARION_BULK_SENDS_BESIDE=0: lanes as
          before issue 28 item 5
  advice  off, plus the old README advice: CLARION_ACTIVATION_PER_SECOND=300, bulk worker nice 10
  nice    the bulk worker niced (CLARION_BULK_NICE=10), nothing else: the default until session 26
  calm    nice, and bulk sends one at a time while receipts flow (CLARION_BULK_SENDS_BESIDE=1):
          the default until session 29
  nicedb  nice, and the bulk worker's PostgreSQL backends (and their sessions) niced too
          (CLARION_BULK_NICE_DATABASE)
  calmdb  calm and nicedb: the default
  on      calm, and bulk lanes give way to transactional work in flight (CLARION_BULK_FEEDBACK)
  ondb    on, and the backends niced
  NAME-c1 any of these with the bulk worker at concurrency 1 (2 otherwise)

--stages splits each receipt's latency by the ledger's own timestamps: notify() to its row,
to the route (broker and pick-up), to the arrival at the stand-in (the route's transaction, the
claim's commit, the provider call).

A round may be named more than once (--rounds off,on,off,on: alternate them on a shared host);
the summary gives each setting's mean ratio over its rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import say, table  # noqa: E402
from bench.throughput import Bench, Cleanup  # noqa: E402

OFF = {
    "CLARION_BULK_FEEDBACK": "off",
    "CLARION_BULK_NICE_DATABASE": "off",
    "CLARION_BULK_SENDS_BESIDE": "0",
}
CALM = {**OFF, "CLARION_BULK_NICE": "10", "CLARION_BULK_SENDS_BESIDE": "1"}
ROUNDS: dict[str, dict[str, str]] = {
    "off": {**OFF, "CLARION_BULK_NICE": "0"},
    "advice": {**OFF, "CLARION_BULK_NICE": "10", "CLARION_ACTIVATION_PER_SECOND": "300"},
    "nice": {**OFF, "CLARION_BULK_NICE": "10"},
    "nicedb": {**OFF, "CLARION_BULK_NICE": "10", "CLARION_BULK_NICE_DATABASE": "on"},
    "calm": CALM,
    "calmdb": {**CALM, "CLARION_BULK_NICE_DATABASE": "on"},
    "on": {**CALM, "CLARION_BULK_FEEDBACK": "on"},
    "ondb": {**CALM, "CLARION_BULK_FEEDBACK": "on", "CLARION_BULK_NICE_DATABASE": "on"},
}
# a round named NAME-c1 is NAME with the bulk worker at concurrency 1 (two pool processes else)


def _settings(name: str) -> tuple[dict[str, str], int]:
    """The round's settings over the defaults, and its bulk worker's concurrency."""
    base, _, tail = name.partition("-c")
    return dict(ROUNDS[base]), int(tail or 2)


def _round_apart(
    name: str, base: dict[str, str], logs: Path, args: argparse.Namespace, issue: int
) -> list[str]:
    """Run one round in a fresh interpreter (spawned): no Celery, kombu or engine state carried
    over from the round before (a second round in one process published nowhere)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_round_child, args=(name, base, logs, args, issue, child))
    process.start()
    row: list[str] = parent.recv()
    process.join(60)
    return row


def _round_child(
    name: str, base: dict[str, str], logs: Path, args: argparse.Namespace, issue: int, conn
) -> None:
    os.chdir(ROOT)
    _exit_on_term()
    try:
        conn.send(_round(name, base, logs, args, issue))
    except BaseException as exc:
        conn.send([name, f"failed: {type(exc).__name__}: {exc}", "", "", "", "", "", "", ""])
        raise


def _exit_on_term() -> None:
    """SIGTERM (timeout, kill) unwinds like Ctrl-C: the round's workers are stopped by its
    `finally`, not left consuming the shared broker for the next run."""
    import signal

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _round(
    name: str, base: dict[str, str], logs: Path, args: argparse.Namespace, issue: int
) -> list[str]:
    from tests.support.campaign import (
        Receipts,
        StandIn,
        drain_rate,
        drained,
        email_env,
        p95,
        start_campaign,
        start_lanes,
        wait_for,
    )
    from tests.support.cluster import Cluster

    stand_in = StandIn()
    try:
        env = {**base, **email_env(stand_in.url, stand_in.api_key, args.per_second)}
        changes, bulk_concurrency = _settings(name)
        env |= changes
        _use(env)
        cluster = Cluster(env, logs / f"round-{issue}-{name}")
        try:
            start_lanes(cluster, concurrency=bulk_concurrency)
            receipts = Receipts(stand_in, f"{issue}-{name}-")  # a repeated round: new events
            receipts.steady(args.rate, 3)
            mark = len(receipts.started)
            before = receipts.steady(args.rate, args.seconds / 2)
            idle_orders = list(receipts.started)[mark:]
            say(f"  {name}: receipts idle p95 {p95(before) * 1000:.1f} ms")
            began = time.monotonic()
            start_campaign(f"round-{issue}")
            wait_for(lambda: stand_in.campaign_count() >= args.size // 20, 600, "campaign")
            alone = drain_rate(stand_in, args.drain)
            phase = time.monotonic()
            mark = len(receipts.started)
            busy = receipts.steady(args.rate, args.seconds)
            ended = time.monotonic()
            busy_orders = list(receipts.started)[mark:]
            say(f"  {name}: receipts beside the campaign p95 {p95(busy) * 1000:.1f} ms")
            drained(stand_in, args.size, 7200)
            whole = time.monotonic() - began
            idle = sorted(before + receipts.steady(args.rate, args.seconds / 2))
        finally:
            cluster.stop_together()
        got = stand_in.close()
    finally:
        stand_in.kill()
    if args.stages:
        for phase_name, orders in (("idle", idle_orders), ("beside", busy_orders)):
            _stages(f"{name}, {phase_name}", orders, receipts.started, got.receipts)
    beside = sum(1 for t in got.campaign_at if phase <= t <= ended) / (ended - phase)
    overlapped = max(got.campaign_at) > ended
    for phase_name, values in (("idle", idle), ("beside the campaign", busy)):
        say(
            f"  {name}, receipts {phase_name}: p50 {values[len(values) // 2] * 1000:.1f} ms, "
            f"p95 {p95(values) * 1000:.1f} ms, max {values[-1] * 1000:.1f} ms (n={len(values)})"
        )
    return [
        name,
        f"{p95(idle) * 1000:.1f}",
        f"{p95(busy) * 1000:.1f}",
        f"{p95(busy) / p95(idle):.2f}x" + ("" if overlapped else " (campaign ended early)"),
        f"{alone:,.0f}",
        f"{beside:,.0f}",
        f"{whole:,.0f}",
        f"{len(got.campaign_to):,}",
        f"{sum(got.campaign_to.values()) - len(got.campaign_to)}",
    ]


def _stages(
    label: str,
    orders: list[str],
    started: dict[str, float],
    arrived: dict[str, tuple[float, str, str | None]],
) -> None:
    """Where the receipts' time went, from the ledger's own timestamps (wall clock, one host):
    notify() to its row's created_at, to the route's routed_at (broker and pick-up), to the
    delivery's created_at (the route's gates), to the arrival at the stand-in (commit, claim and
    the provider call); p50 and p95 of each, in ms."""
    from sqlalchemy import text

    from clarion.db.engine import engine

    offset = time.time() - time.monotonic()
    with engine().connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.variables ->> 'order', extract(epoch FROM r.created_at), "
                "extract(epoch FROM r.routed_at), extract(epoch FROM d.created_at) "
                "FROM requests r JOIN deliveries d ON d.user_id = r.user_id AND d.request_id = r.id "
                "WHERE r.type_key = 'receipt_email' AND r.variables ->> 'order' = ANY(:o)"
            ),
            {"o": orders},
        ).all()
    parts: dict[str, list[float]] = {"insert": [], "pick-up": [], "route": [], "send": []}
    for order, created, routed, delivery in rows:
        start = started[order] + offset
        arrival = arrived[f"Receipt {order}"][0] + offset
        for part, value in zip(
            parts,
            (
                float(created) - start,
                float(routed - created),
                float(delivery - routed),
                arrival - float(delivery),
            ),
            strict=True,
        ):
            parts[part].append(float(value))
    say(
        f"  {label} stages (n={len(rows)}): "
        + ", ".join(
            f"{part} {_pct(values, 0.5):.1f}/{_pct(values, 0.95):.1f}"
            for part, values in parts.items()
        )
        + " ms (p50/p95)"
    )
    # the tail: where the slowest 5% of receipts (by their whole latency) spent it, on average
    totals = [sum(values) for values in zip(*parts.values(), strict=True)]
    cut = _pct(totals, 0.95) / 1000
    slow = [i for i, total in enumerate(totals) if total >= cut]
    if slow:
        say(
            f"  {label} slowest {len(slow)} (>= {cut * 1000:.1f} ms), mean ms: "
            + ", ".join(
                f"{part} {sum(values[i] for i in slow) / len(slow) * 1000:.1f}"
                for part, values in parts.items()
            )
        )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _use(env: dict[str, str]) -> None:
    """This process (the producer) with the round's settings."""
    from clarion import settings
    from clarion.db import engine
    from clarion.tasks import runtime

    for key in [k for k in os.environ if k.startswith("CLARION_")]:
        del os.environ[key]
    os.environ.update(env)
    settings.reset()
    runtime.reset()
    engine.dispose_all()
    from clarion.tasks.app import use_broker

    use_broker(env["CLARION_BROKER_URL"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=20_000, help="campaign recipients (20,000)")
    parser.add_argument(
        "--rounds", default="nice,calm", help="off, advice, nice, calm, on; repeat to alternate"
    )
    parser.add_argument("--rate", type=float, default=10.0, help="receipts per second (10)")
    parser.add_argument("--seconds", type=float, default=30.0, help="receipts phase (30 s)")
    parser.add_argument("--drain", type=float, default=10.0, help="campaign alone (10 s)")
    parser.add_argument("--per-second", type=int, default=2000, help="provider budget (2000)")
    parser.add_argument(
        "--stages", action="store_true", help="where the receipts' time went (ledger timestamps)"
    )
    args = parser.parse_args(argv)
    rounds = [r.strip() for r in args.rounds.split(",")]
    if unknown := {r for r in rounds if r.partition("-c")[0] not in ROUNDS}:
        parser.error(f"unknown rounds: {sorted(unknown)}")
    os.chdir(ROOT)
    _exit_on_term()
    cleanup = Cleanup()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    try:
        bench = Bench(
            argparse.Namespace(profile=None, timeout=600, purge=False, event_endpoint=False),
            cleanup,
        )
        bench.services()
        bench.database()
        bench.environment()
        _use({**bench.env, "CLARION_CATALOG": str(ROOT / "tests" / "catalog_lanes.yaml")})
        from tests.support.campaign import audience

        audience(args.size)
        rows = [_round_apart(name, bench.env, bench.logs, args, i) for i, name in enumerate(rounds)]
    except KeyboardInterrupt:
        return 130
    finally:
        cleanup.close()
    say(
        f"\nlanes under a {args.size:,}-recipient email campaign, provider budget "
        f"{args.per_second}/s, receipts {args.rate:g}/s; cpus={os.cpu_count()}, load average at "
        f"start {load}"
    )
    say(
        table(
            [
                "round",
                "idle p95 ms",
                "campaign p95 ms",
                "ratio",
                "campaign/s alone",
                "campaign/s beside",
                "whole s",
                "arrived",
                "twice",
            ],
            rows,
        )
    )
    ok = [(name, row) for name, row in zip(rounds, rows, strict=True) if row[1][:1].isdigit()]
    for name in dict.fromkeys(n for n, _ in ok):
        ratios = [float(r[3].split("x")[0]) for n, r in ok if n == name]
        alone = [float(r[4].replace(",", "")) for n, r in ok if n == name]
        say(
            f"{name}: p95 ratio {sum(ratios) / len(ratios):.2f}x (mean of {len(ratios)}: "
            f"{', '.join(f'{x:.2f}' for x in ratios)}), campaign/s alone "
            f"{sum(alone) / len(alone):,.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
