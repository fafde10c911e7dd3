"""Sending throughput with an app's outbound-event endpoint failing, against the run with it healthy.

    cd /work/main && .venv/bin/python bench/outbound.py [--n 2000] [--rounds 3] [--layout lanes]

Issue 25's must-show: "sending throughput with that endpoint failing within 10% of the run with it
healthy". Each run is bench/throughput.py's clarion phase (N `receipt` notifications through
`notify_many`, webhook channel into a standins.receiver.Receiver, the clock stopping when all N
arrived, after the same untimed warm-up) with an endpoint registered for every event kind, so each
request and send writes its events, and a worker on the `events` queue posting them to a
standins/fake_app_endpoint.py that is either

  healthy  answering 204 to every event, or
  failing  answering, in turn, 500, a timeout (held past CLARION_EVENTS_TIMEOUT) and a drop (the
           event taken, the connection closed without an answer), for the whole run; retries
           come back after 0.1 s (CLARION_EVENTS_FIRST_RETRY), so the endpoint is hit all along.

The two alternate round by round (who goes first rotates), on the same database and fresh workers,
so the machine's load falls on both alike. Prints notifications/s of each run and the ratio
failing/healthy, median over rounds.

--layout lanes (default) runs what docs/operations/index.md documents: the sending lanes'
workers, and one `clarion worker --lane events` beside them. --layout shared runs the events queue
in the sending workers too (what `clarion worker` without --lane consumes). Services as in
bench/throughput.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import say, table  # noqa: E402
from bench.throughput import (  # noqa: E402
    CLARION_QUEUES,
    Bench,
    Cleanup,
    Result,
    _hostname,
    _interrupt,
)

MODES = ("healthy", "failing")
EVENTS_ENV = {
    "CLARION_EVENTS_TIMEOUT": "1.0",
    "CLARION_EVENTS_FIRST_RETRY": "0.1",
}
HOLD = 1.5  # seconds a "timeout" answer holds the request: past CLARION_EVENTS_TIMEOUT


class OutboundBench(Bench):
    """bench/throughput.py's clarion phase with an events worker beside the sending ones."""

    def __init__(self, args: argparse.Namespace, cleanup: Cleanup) -> None:
        super().__init__(args, cleanup)
        self.shared = args.layout == "shared"
        self.queues = (*CLARION_QUEUES, "events") if self.shared else CLARION_QUEUES

    def environment(self) -> None:
        super().environment()
        self.env.update(EVENTS_ENV)
        os.environ.update(EVENTS_ENV)

    def side_queues(self) -> tuple[str, ...]:
        return () if self.shared else ("events",)

    def side_workers(self, processes: list) -> list[str]:
        if self.shared:
            return []
        from clarion.ops.launch import worker_command

        name = f"bevents{self.tag}"
        self.start(
            worker_command(
                ("events",), concurrency=self.args.events_concurrency, name=name, loglevel="INFO"
            ),
            f"r{self.round}-events-worker.log",
            processes,
        )
        return [_hostname(name)]


def endpoint_for(url: str) -> str:
    """A fresh endpoint wanting every kind at `url` (the previous round's goes, with its sends)."""
    from clarion.tasks import event_endpoints

    for old in event_endpoints.listed():
        event_endpoints.remove(old.id)
    return event_endpoints.create(url, ["*"], description="bench/outbound.py").secret


def one_run(bench: OutboundBench, mode: str) -> tuple[Result, dict[str, int]]:
    from clarion.standins.fake_app_endpoint import FakeAppEndpoint
    from clarion.standins.receiver import Receiver

    with Receiver(bench.secret) as receiver, FakeAppEndpoint([], hold=HOLD) as app:
        app.state.secrets.append(endpoint_for(app.url))
        if mode == "failing":
            for _ in range(20_000):
                for misbehaviour in ("500", "timeout", "drop"):
                    app.state.script(misbehaviour)
        say(f"\n[{mode} endpoint]")
        result = bench.clarion(receiver)
        answers: dict[str, int] = {}
        for arrival in app.state.snapshot():
            answers[arrival.answer] = answers.get(arrival.answer, 0) + 1
        if mode == "failing":
            app.state.clear_script()
    result.name = f"{mode} endpoint"
    return result, answers


def _cpu(r: Result) -> str:
    """CPU ms per notification of the workers, beat, PostgreSQL, Redis and this process (the
    steadier figure on a shared machine: the rates follow the CPU other processes leave)."""
    return "-" if r.cpu_ms is None else f"{r.cpu_ms:.2f}"


def report(runs: dict[str, list[tuple[Result, dict[str, int]]]], args, load: str) -> float:
    rows = []
    for number in range(args.rounds):
        h, f = runs["healthy"][number][0], runs["failing"][number][0]
        rows.append(
            [
                f"round {number + 1}",
                f"{h.rate:,.0f}",
                f"{f.rate:,.0f}",
                f"{f.rate / h.rate:.3f}",
                _cpu(h),
                _cpu(f),
                " ".join(f"{k}:{v}" for k, v in sorted(runs["healthy"][number][1].items())),
                " ".join(f"{k}:{v}" for k, v in sorted(runs["failing"][number][1].items())),
            ]
        )
    ratios = [f[0].rate / h[0].rate for h, f in zip(runs["healthy"], runs["failing"], strict=True)]
    say(
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC  N={args.n}  layout={args.layout}  "
        f"workers={args.workers} x -c {args.concurrency}"
        + ("" if args.layout == "shared" else f" + events -c {args.events_concurrency}")
        + f"  cpus={os.cpu_count()}  load average at start {load}, at end "
        + " ".join(f"{v:.2f}" for v in os.getloadavg())
    )
    say(
        table(
            [
                "",
                "healthy/s",
                "failing/s",
                "failing/healthy",
                "CPU ms/item h",
                "CPU ms/item f",
                "healthy endpoint saw",
                "failing endpoint saw",
            ],
            rows,
        )
    )
    for number in range(args.rounds):
        for mode in MODES:
            result = runs[mode][number][0]
            say(f"  round {number + 1} {mode}: {result.notes[0] if result.notes else ''}")
    incomplete = [r.name for rs in runs.values() for r, _ in rs if not r.complete]
    median = statistics.median(ratios)
    say(f"failing/healthy, median over {args.rounds} round(s): {median:.3f}")
    cpu = [
        f[0].cpu_ms / h[0].cpu_ms
        for h, f in zip(runs["healthy"], runs["failing"], strict=True)
        if f[0].cpu_ms and h[0].cpu_ms
    ]
    if cpu:
        say(f"CPU per notification failing/healthy, median: {statistics.median(cpu):.3f}")
    if incomplete:
        say(f"INCOMPLETE runs: {incomplete}")
    return median


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="notifications per run (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of healthy+failing (3)")
    parser.add_argument("--workers", type=int, default=1, help="sending worker processes (1)")
    parser.add_argument("--concurrency", type=int, default=2, help="their pool size (2)")
    parser.add_argument("--events-concurrency", type=int, default=2, help="events worker's (2)")
    parser.add_argument("--layout", choices=("lanes", "shared"), default="lanes")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run (600)")
    args = parser.parse_args(argv)
    # what bench/throughput.py's clarion phase reads
    args.pool, args.chunk, args.recipients, args.settle = "prefork", 500, 1000, 1.0
    args.event_endpoint, args.purge, args.profile = False, False, None
    args.profile_rate, args.profile_mode = 100, "wall"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)
    signal.signal(signal.SIGTERM, _interrupt)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    cleanup = Cleanup()
    try:
        bench = OutboundBench(args, cleanup)
        bench.services()
        bench.database()
        bench.environment()
        runs: dict[str, list[tuple[Result, dict[str, int]]]] = {m: [] for m in MODES}
        bench.round = 0
        for number in range(args.rounds):
            order = MODES if number % 2 == 0 else MODES[::-1]
            for mode in order:
                bench.round += 1  # numbers the runs' logs: r1-..., r2-...
                bench.tag = f"{bench.run_id}r{bench.round}"
                runs[mode].append(one_run(bench, mode))
                time.sleep(1)
        cleanup.close()
        report(runs, args, load)
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything this run started", file=sys.stderr)
        return 130
    finally:
        cleanup.close()


if __name__ == "__main__":
    sys.exit(main())
