"""Latency: notify → provider, idle, at half the measured maximum rate, and on the transactional
lane while an activation backlog is queued; each as a ratio to the idle p95, in one run.

    .venv/bin/python bench/latency.py [--backlog 100000] [--burst 3000]

Workers per lane, as production runs them (docs/operations/index.md): one for
`transactional`, one for `activation`, one for `control`, plus beat; webhook channel into an
standins.receiver.Receiver that notes when each idempotency key first arrived (the activation nudges
go to a second Receiver in a child process: providers are other machines, and its flood must not
share this process's GIL with the producer and the receiver being timed). A latency is the time
from the notify_many call that enqueued a notification to its arrival at the receiver; a paced
producer calls it every --tick seconds with the notifications due since its last call.

  idle        `receipt` (transactional) at --idle-rate per second, one notify() each
  max rate    a burst of --burst receipts through notify_many: the rate they arrive at
  half rate   receipts paced at half that rate (notify_many every --tick s with the ones due)
  backlog     --backlog `nudge` (activation) notifications queued with notify_many, then receipts
              at --idle-rate while the activation worker drains them with the defaults: the
              activation lane gives way to transactional work in flight and paces itself by
              feedback (CLARION_BULK_FEEDBACK, tasks/lanes.py), its worker niced
              (CLARION_BULK_NICE), no rate cap (--activation-per-second sets
              CLARION_ACTIVATION_PER_SECOND); the rate the backlog drained at is reported next
              to the ratio. `--feedback off --activation-nice 0` is the lanes before issue 28.

Target (issue 14): transactional p95 under the backlog ≤ 1.5× the idle p95. Services, database
and logs as bench/throughput.py (the same helpers); CPU use of the machine is reported per phase.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402 - after the sys.path line above
    Bench,
    Cleanup,
    _hostname,
    _machine_busy,
    _stop_all,
    _wait,
    _wait_for_workers,
    say,
)

LANES = {"transactional": 2, "activation": 2, "control": 1}  # worker per lane: pool size

CATALOG = """
types:
  receipt:
    category: transactional
    channels: [webhook]
    required: [order]
    templates:
      - {{version: 1, title: "Receipt {{{{ order }}}}", body: "Thanks for order {{{{ order }}}}."}}
  nudge:
    category: activation
    channels: [webhook]
    required: [name]
    options: {{window_exempt: true}}
    config: {{webhook: {{url: "{url}"}}}}
    templates:
      - {{version: 1, title: "Hi {{{{ name }}}}", body: "Your plan is waiting."}}
"""


def _serve(secret: str, conn, nice: int) -> None:
    """The activation lane's provider stand-in, in a process of its own (at `nice`): its flood
    must not share the GIL with the producer and the transactional receiver being timed."""
    from clarion.standins.receiver import Receiver

    os.nice(nice)
    with Receiver(secret) as receiver:
        conn.send(receiver.url)
        while conn.recv() == "count":  # else: told to stop
            conn.send(receiver.arrivals.unique)
        conn.send((receiver.arrivals.unique, receiver.arrivals.repeats))


class OtherReceiver:
    """A Receiver in a child process: its URL, and (unique, repeats) at the end."""

    def __init__(self, secret: str, nice: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(secret, child, nice), daemon=True)
        self.process.start()
        self.url: str = self.conn.recv()

    def arrived(self) -> int:
        self.conn.send("count")
        return self.conn.recv()

    def close(self) -> tuple[int, int]:
        self.conn.send("stop")
        counts = self.conn.recv()
        self.process.join(10)
        return counts


class Latency:
    def __init__(self, bench: Bench, receiver, args: argparse.Namespace) -> None:
        self.bench, self.receiver, self.args = bench, receiver, args
        self.users = [f"u{bench.tag}-{i}" for i in range(args.recipients)]
        self.sequence = 0

    def start_workers(self) -> None:
        from clarion.db.engine import engine
        from clarion.ops.launch import beat_command, worker_command
        from clarion.tasks import register_recipient
        from clarion.tasks.app import app, use_broker

        b = self.bench
        use_broker(b.broker_url)
        with engine().begin() as conn:
            for user in self.users:
                register_recipient(user, timezone="UTC", connection=conn)
        processes: list = []
        b.cleanup.add(_stop_all, processes)
        names = []
        for lane, concurrency in LANES.items():
            name = f"blat{b.tag}-{lane}"
            names.append(_hostname(name))
            command = worker_command([lane], concurrency=concurrency, name=name, loglevel="WARNING")
            env = {
                "CLARION_WEBHOOK_URL": self.receiver.url,
                "CLARION_BULK_NICE": str(self.args.activation_nice),  # the worker nices itself
                "CLARION_BULK_FEEDBACK": self.args.feedback,
            }
            if self.args.activation_per_second:
                env["CLARION_ACTIVATION_PER_SECOND"] = str(self.args.activation_per_second)
            b.start(command, f"latency-{lane}.log", processes, env=env)
        b.start(beat_command(b.logs), "latency-beat.log", processes)
        _wait_for_workers(app, names, processes)
        self.processes = processes

    def items(self, n: int, type_key: str = "receipt") -> list[dict]:
        out = []
        for _ in range(n):
            j = self.sequence
            self.sequence += 1
            variables = {"order": j} if type_key == "receipt" else {"name": f"N{j}"}
            out.append(
                dict(
                    user_id=self.users[j % len(self.users)],
                    type_key=type_key,
                    event_id=f"{self.bench.tag}-{type_key}-{j}",
                    variables=variables,
                )
            )
        return out

    def key(self, item: dict) -> str:
        from clarion.records import idempotency_key

        return idempotency_key(
            item["user_id"], item["type_key"], f"event:{item['event_id']}", "webhook"
        )

    def paced(self, rate: float, seconds: float) -> tuple[dict[str, float], float]:
        """Receipts at `rate` per second for `seconds`: every --tick seconds the ones due by then,
        in one notify_many; returns idempotency key -> the time that call began (perf_counter),
        and the busy share. A latency starts when notify_many is called (the producer's own
        batching is not clarion's); the phase's achieved rate shows a producer that fell behind."""
        from clarion.tasks import notify_many

        due: dict[str, float] = {}
        total = max(1, round(rate * seconds))
        t0 = time.perf_counter()
        busy0 = _machine_busy()
        sent, call = 0, t0
        while sent < total:
            now = time.perf_counter()
            want = min(total, int((now - t0) * rate) + 1)
            if want > sent:
                batch = self.items(want - sent)
                for item in batch:
                    due[self.key(item)] = now
                notify_many(batch)
                sent = want
            call += self.args.tick
            time.sleep(max(0.0, call - time.perf_counter()))
        self.wait_for(due, 120)
        elapsed = time.perf_counter() - t0
        return due, (_machine_busy() - busy0) / (elapsed * (os.cpu_count() or 1))

    def wait_for(self, keys, timeout: float) -> None:
        first = self.receiver.arrivals.first_at
        _wait(lambda: all(k in first for k in keys), timeout, "arrivals")

    def latencies(self, due: dict[str, float]) -> list[float]:
        first = self.receiver.arrivals.first_at
        return sorted(first[k] - t for k, t in due.items())

    def burst(self, n: int) -> float:
        """Receipts per second through the whole pipeline, for a burst of n."""
        from clarion.tasks import notify_many

        batch = self.items(n)
        keys = [self.key(i) for i in batch]
        t0 = time.perf_counter()
        for s in range(0, n, 500):
            notify_many(batch[s : s + 500])
        self.wait_for(keys, 300)
        first = self.receiver.arrivals.first_at
        return n / (max(first[k] for k in keys) - t0)

    def backlog(self, n: int) -> float:
        """Queue n activation nudges; returns the seconds the enqueueing took."""
        from clarion.tasks import notify_many

        t0 = time.perf_counter()
        for s in range(0, n, 1000):
            notify_many(self.items(min(1000, n - s), "nudge"))
        return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=100_000, help="activation nudges (100k)")
    parser.add_argument("--burst", type=int, default=3000, help="receipts in the max-rate burst")
    parser.add_argument("--idle-rate", type=float, default=10.0, help="receipts/s idle (10)")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per paced phase")
    parser.add_argument("--recipients", type=int, default=1000)
    parser.add_argument(
        "--tick", type=float, default=0.1, help="seconds between a paced producer's calls (0.1)"
    )
    parser.add_argument(
        "--activation-nice",
        type=int,
        default=10,
        help="CLARION_BULK_NICE: CPU niceness the activation lane's worker takes (10, the "
        "default; 0: as the others)",
    )
    parser.add_argument(
        "--feedback",
        choices=("on", "off"),
        default="on",
        help="CLARION_BULK_FEEDBACK: the activation lane gives way to transactional work (on)",
    )
    parser.add_argument(
        "--activation-per-second",
        type=float,
        default=0.0,
        help="CLARION_ACTIVATION_PER_SECOND for every worker (0, the default: no cap; the "
        "feedback paces the lane)",
    )
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    cleanup = Cleanup()
    started = time.perf_counter()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    try:
        from clarion.standins.receiver import Receiver

        # Bench wants throughput's arguments; only these are read by what latency uses
        bench = Bench(
            argparse.Namespace(profile=None, timeout=600, purge=False, event_endpoint=False),
            cleanup,
        )
        bench.services()
        bench.database()
        bench.environment()
        other = OtherReceiver(bench.secret, args.activation_nice)
        cleanup.add(other.process.kill)
        catalog = bench.logs / "latency-catalog.yaml"
        catalog.write_text(CATALOG.format(url=other.url))
        os.environ["CLARION_CATALOG"] = bench.env["CLARION_CATALOG"] = str(catalog)
        from clarion import settings
        from clarion.tasks import runtime

        settings.reset()
        runtime.reset()
        say(f"logs: {bench.logs.relative_to(ROOT)}")
        with Receiver(bench.secret) as receiver:
            run = Latency(bench, receiver, args)
            run.start_workers()
            run.paced(args.idle_rate, 3)  # warm-up: every pool process connected
            rows = []
            say(f"idle: receipts at {args.idle_rate:g}/s for {args.seconds:g}s")
            idle, busy = run.paced(args.idle_rate, args.seconds)
            idle_l = run.latencies(idle)
            rows.append(("idle", args.idle_rate, idle_l, busy))
            say(f"max rate: a burst of {args.burst} receipts")
            top = run.burst(args.burst)
            say(f"  {top:,.0f}/s; half rate: {top / 2:,.0f}/s for {args.seconds:g}s")
            half, busy = run.paced(top / 2, args.seconds)
            rows.append(("half max rate", top / 2, run.latencies(half), busy))
            say(f"backlog: queueing {args.backlog:,} activation nudges")
            began, before = time.perf_counter(), other.arrived()
            took = run.backlog(args.backlog)
            say(f"  queued in {took:.1f}s; receipts at {args.idle_rate:g}/s for {args.seconds:g}s")
            under, busy = run.paced(args.idle_rate, args.seconds)
            drained = (other.arrived() - before) / (time.perf_counter() - began)
            rows.append(("under activation backlog", args.idle_rate, run.latencies(under), busy))
            from sqlalchemy import text

            from clarion.db.engine import engine

            with engine().connect() as conn:
                left = conn.execute(
                    text(
                        "SELECT count(*) FROM requests r WHERE lane = 'activation' AND NOT EXISTS "
                        "(SELECT 1 FROM deliveries d WHERE d.user_id = r.user_id "
                        "AND d.request_id = r.id AND d.state = 'sent')"
                    )
                ).scalar_one()
                states = conn.execute(
                    text("SELECT lane, state, count(*) FROM deliveries GROUP BY 1, 2 ORDER BY 1, 2")
                ).all()
                reasons = conn.execute(
                    text(
                        "SELECT gate, reason, count(*) FROM decisions WHERE outcome <> 'allow' "
                        "GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 5"
                    )
                ).all()
            say(f"deliveries by lane and state: {[tuple(r) for r in states]}")
            say(f"not delivered, by gate and reason: {[tuple(r) for r in reasons] or 'none'}")
            duplicates = receiver.arrivals.repeats
        activation, repeats = other.close()
        _report(
            rows,
            top,
            left,
            args,
            duplicates + repeats,
            load,
            time.perf_counter() - started,
            drained,
        )
        say(f"activation nudges that arrived: {activation:,}")
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        cleanup.close()


def _report(rows, top, left, args, duplicates, load, wall, drained) -> None:
    idle_p95 = pct(rows[0][2], 0.95)
    say("\n" + "=" * 100)
    say(
        f"clarion latency, notify → provider (webhook)   cpus={os.cpu_count()}   "
        f"load average at start {load}   max rate measured {top:,.0f}/s   "
        f"producer tick {args.tick:g}s   activation worker nice {args.activation_nice}   "
        f"feedback {args.feedback}   "
        f"activation budget {args.activation_per_second or 'none'}/s"
    )
    say("-" * 100)
    say(
        f"{'phase':<28}{'rate/s':>9}{'n':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
        f"{'p95/idle p95':>14}{'machine busy':>14}"
    )
    for name, rate, values, busy in rows:
        p95 = pct(values, 0.95)
        say(
            f"{name:<28}{rate:>9,.0f}{len(values):>7}{statistics.median(values) * 1000:>9.1f}"
            f"{p95 * 1000:>9.1f}{pct(values, 0.99) * 1000:>9.1f}{p95 / idle_p95:>13.2f}x"
            f"{busy:>14.0%}"
        )
    say("-" * 100)
    ratio = pct(rows[-1][2], 0.95) / idle_p95
    say(
        f"transactional p95 under a {args.backlog:,} activation backlog = {ratio:.2f}x idle p95 "
        f"(target <= 1.5x): {'met' if ratio <= 1.5 else 'NOT met'}; activation requests still "
        f"unsent at the end: {left:,}; drained meanwhile at {drained:,.0f}/s; duplicate "
        f"arrivals: {duplicates}"
    )
    say(f"script wall time {wall:.1f}s")


if __name__ == "__main__":
    sys.exit(main())
