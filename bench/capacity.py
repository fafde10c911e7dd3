"""Capacity on paper from measurement: CPU seconds per notification by process kind, PostgreSQL
connections per process, WAL and stored bytes per notification, and the sizing they give for 1M,
10M and 100M notifications a day.

    .venv/bin/python bench/capacity.py [--n 4000] [--clients 8] [--concurrency 2] [--peak 5]

One run on one PostgreSQL and one Redis (the embedded pair in .clarion/bench-ingest, or
CLARION_DATABASE_URL / CLARION_REDIS_URL), a fresh database: `clarion web` (one server process),
one worker on every queue (`--concurrency` pool processes; its app is bench/capacity_probe.py,
clarion's own plus a CPU count per task) and `clarion beat`, the webhook into a local receiver.
After a warm-up, `--n` single `POST /v1/events` of the transactional `receipt` type (one webhook
delivery each) from `--clients` connections; the clock stops when every one arrived.

Measured over that window:
  CPU      per process kind, from /proc (whole process trees): the web server; the worker, split
           by the probe into route tasks, deliver tasks, control tasks (the tick) and the rest
           (the main process, the pools' own work between tasks); beat; PostgreSQL; Redis.
  conns    the most connections each kind held at once (pg_stat_activity by application_name,
           set per process kind with PGAPPNAME), and per process of the kind.
  WAL      pg_current_wal_lsn() after minus before, per notification (ticks included).
  stored   the growth of clarion's tables and indexes (pg_total_relation_size), per notification.

The baseline, in the same run: bench/ingest_baseline.py (one INSERT per request, no worker) takes
the same `--n` requests with clarion's worker and beat stopped; its server's and PostgreSQL's
CPU, WAL and stored bytes per request, and clarion's as a ratio of them.

The sizing table is arithmetic on those figures, printed with its assumptions: a peak hour at
`--peak` times the day's average rate, processes at `--utilisation` of a core, `--retention`
days kept (CLARION_RETENTION_DAYS), partitions of at most `--rows-per-partition` rows.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import say, table  # noqa: E402
from bench.ingest import BIN, Bench, events, load, wait_for  # noqa: E402
from bench.throughput import _server_pids, _tree_cpu  # noqa: E402

SECRET = "bench-ingest-secret"  # bench.ingest's environment signs webhooks with it
KINDS = ("web", "worker", "beat")
DAYS = (1_000_000, 10_000_000, 100_000_000)


def _psql(url: str, sql: str, *params: object) -> list[tuple]:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return conn.execute(sql, params or None).fetchall()


CLARION_TABLES = (
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname LIKE 'clarion%' AND c.relkind IN ('r', 'p')"
)
BASELINE_TABLE = "SELECT pg_total_relation_size('bench_events')"


def _stored(url: str, sql: str) -> int:
    """Bytes of the tables `sql` sums, with their indexes and TOAST."""
    [(size,)] = _psql(url, sql)
    return int(size)


def _timed(
    url: str, trees: dict[str, list[int]], tables: str, run: Callable[[], object]
) -> tuple[dict[str, float], int, int, float]:
    """CPU seconds of each process tree, WAL bytes, stored bytes (of `tables`) and seconds that
    `run()` took."""
    wal0, stored0 = _wal(url), _stored(url, tables)
    cpu0 = {k: _tree_cpu(v) for k, v in trees.items()}
    began = time.perf_counter()
    run()
    elapsed = time.perf_counter() - began
    cpu = {k: _tree_cpu(v) - cpu0[k] for k, v in trees.items()}
    return cpu, _wal(url) - wal0, _stored(url, tables) - stored0, elapsed


def _wal(url: str) -> int:
    [(lsn,)] = _psql(url, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
    return int(lsn)


class Connections(threading.Thread):
    """The most backends each process kind held at once, sampled twice a second."""

    def __init__(self, url: str, database: str) -> None:
        super().__init__(daemon=True)
        self.url, self.database = url, database
        self.peak: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            rows = _psql(
                self.url,
                "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
                "GROUP BY 1",
                self.database,
            )
            for name, n in rows:
                self.peak[name] = max(self.peak.get(name, 0), int(n))


def _processes(root: int) -> int:
    """Processes in the tree under `root` (a worker's main process and its pool)."""
    count, todo = 0, [root]
    while todo:
        pid = todo.pop()
        count += 1
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=4000, help="notifications in the timed run")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=2, help="the worker's pool processes")
    parser.add_argument("--peak", type=float, default=5.0, help="peak hour / daily average rate")
    parser.add_argument("--utilisation", type=float, default=0.6, help="of a core, at the peak")
    parser.add_argument("--retention", type=int, default=90, help="days kept")
    parser.add_argument("--rows-per-partition", type=float, default=50e6)
    args = parser.parse_args(argv)
    bench = Bench(args)
    try:
        return _run(bench, args)
    finally:
        bench.stop()


def _run(bench: Bench, args: argparse.Namespace) -> int:
    import redis

    from bench.capacity_probe import COUNT, CPU
    from clarion.ops import launch
    from clarion.standins.receiver import Receiver

    bench.setup()
    receiver = Receiver(SECRET).__enter__()
    bench.stops.append(lambda: receiver.__exit__(None, None, None))
    env = {**bench.env, "CLARION_WEBHOOK_URL": receiver.url}
    logs = ROOT / ".clarion" / "bench-capacity"
    logs.mkdir(parents=True, exist_ok=True)
    port = bench.serve(
        [str(BIN / "clarion"), "web", "--host", "127.0.0.1", "--workers", "1"],
        {**env, "PGAPPNAME": "web"},
    )
    worker = launch.Process(
        [sys.executable, "-m", "celery", "-A", "bench.capacity_probe", "worker"]
        + ["-Q", ",".join(launch.QUEUES), "-c", str(args.concurrency), "-n", "capacity@%h"]
        + ["--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
        env={**env, "PGAPPNAME": "worker"},
        log=logs / "worker.log",
        cwd=ROOT,
    )
    bench.stops.append(worker.stop)
    beat = launch.Process(
        launch.beat_command(logs), env={**env, "PGAPPNAME": "beat"}, log=logs / "beat.log"
    )
    bench.stops.append(beat.stop)
    wait_for(port)
    web = [int(p) for p in _listening(port) if int(p) != os.getpid()]
    auth = {"Authorization": f"Bearer {bench.key}"}
    warm = 200
    load(port, auth, events("warm", warm), args.clients)
    if not launch.wait_until(lambda: receiver.arrivals.unique >= warm, 120):
        raise SystemExit(f"the warm-up did not arrive; see {logs}")
    client = redis.Redis.from_url(env["CLARION_REDIS_URL"], decode_responses=True)
    client.delete(CPU, COUNT)
    pg, rd = _server_pids(bench.url, env["CLARION_REDIS_URL"])
    trees = {"web": web, "worker": [worker.pid], "beat": [beat.pid], "postgres": pg, "redis": rd}
    database = bench.url.rsplit("/", 1)[1].split("?")[0]
    conns = Connections(bench.url, database)
    conns.start()
    processes = {"web": sum(map(_processes, web)), "worker": _processes(worker.pid), "beat": 1}
    load0 = os.getloadavg()[0]

    def clarion_run() -> None:
        load(port, auth, events("cap", args.n), args.clients)
        if not launch.wait_until(lambda: receiver.arrivals.unique >= warm + args.n, 600, 0.05):
            raise SystemExit(f"not every notification arrived; see {logs}")

    cpu, wal, stored, elapsed = _timed(bench.url, trees, CLARION_TABLES, clarion_run)
    conns.stop.set()
    conns.join()
    tasks = {str(k): float(v) for k, v in client.hgetall(CPU).items()}
    ran = {str(k): int(v) for k, v in client.hgetall(COUNT).items()}
    n = args.n
    route = tasks.pop("clarion.route", 0.0)
    deliver = tasks.pop("clarion.deliver", 0.0)
    control = sum(tasks.values())
    kinds = {
        "web (ingest: POST /v1/events)": cpu["web"],
        "worker: route tasks (route, and the send on a lane without a budget)": route,
        "worker: deliver tasks (retries, takeovers, budgeted lanes)": deliver,
        "worker: control tasks (tick, …)": control,
        "worker: main process and pool, between tasks": cpu["worker"] - route - deliver - control,
        "beat": cpu["beat"],
        "PostgreSQL": cpu["postgres"],
        "Redis (broker)": cpu["redis"],
    }
    say(
        f"\n{n} notifications (receipt, one webhook each) in {elapsed:.1f} s = {n / elapsed:.0f}/s; "
        f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; tasks run: {ran}\n"
    )
    say(
        table(
            ["process kind", "CPU ms / notification"],
            [[k, f"{v / n * 1000:.2f}"] for k, v in kinds.items()],
        )
    )
    per_process = {k: conns.peak.get(k, 0) / max(1, processes[k]) for k in KINDS}
    say(
        "\n"
        + table(
            ["process kind", "processes", "peak connections", "per process"],
            [
                [k, str(processes[k]), str(conns.peak.get(k, 0)), f"{per_process[k]:.1f}"]
                for k in KINDS
            ],
        )
    )
    say(f"\nWAL {wal / n:.0f} B / notification; stored {stored / n:.0f} B / notification")
    # The baseline, in the same run: the least an ingest endpoint on this stack does (one
    # INSERT per request, bench/ingest_baseline.py), with clarion's worker and beat stopped.
    worker.stop()
    beat.stop()
    base_env = {**env, "BENCH_BASELINE_URL": bench.url.replace("+psycopg", "")}
    base_argv = [str(BIN / "uvicorn"), "bench.ingest_baseline:app", "--log-level", "warning"]
    base_port = bench.serve([*base_argv, "--host", "127.0.0.1"], base_env)
    wait_for(base_port, "/v1/events-missing")
    load(base_port, {}, events("warm", warm), args.clients)
    base_trees = {
        "web": [int(p) for p in _listening(base_port) if int(p) != os.getpid()],
        "postgres": pg,
    }
    base_cpu, base_wal, base_stored, base_elapsed = _timed(
        bench.url,
        base_trees,
        BASELINE_TABLE,
        lambda: load(base_port, {}, events("base", n), args.clients),
    )
    ours = {
        "ingest server CPU": cpu["web"],
        "PostgreSQL CPU": cpu["postgres"],
        "all CPU (servers, workers, beat, PostgreSQL, Redis)": sum(kinds.values()),
        "WAL bytes": wal,
        "stored bytes": stored,
    }
    theirs = [base_cpu["web"], base_cpu["postgres"], sum(base_cpu.values()), base_wal, base_stored]
    say(
        f"\nAgainst the baseline (one INSERT per request, no worker), same run, {n} requests in "
        f"{base_elapsed:.1f} s:\n"
        + table(
            ["per notification", "clarion", "baseline", "ratio"],
            [
                [
                    k,
                    f"{v / n * (1 if 'bytes' in k else 1000):.2f}",
                    f"{b / n * (1 if 'bytes' in k else 1000):.2f}",
                    f"{v / b:.1f}x" if b else "-",
                ]
                for (k, v), b in zip(ours.items(), theirs, strict=True)
            ],
        )
        + "\n(CPU in ms)"
    )
    say("\n" + _sizing(args, kinds, per_process, wal / n, stored / n))
    return 0


def _listening(port: int) -> list[str]:
    """PIDs of the processes that have `port` open (the web server and its children)."""
    import subprocess

    done = subprocess.run(["fuser", f"{port}/tcp"], capture_output=True, text=True)
    return done.stdout.split()


def _sizing(
    args: argparse.Namespace,
    kinds: dict[str, float],
    per_process: dict[str, float],
    wal: float,
    stored: float,
) -> str:
    """The sizing table: stated arithmetic on the measured figures (per notification)."""
    n = args.n
    web = kinds["web (ingest: POST /v1/events)"] / n
    workers = sum(v for k, v in kinds.items() if k.startswith("worker")) / n
    database = kinds["PostgreSQL"] / n
    rows = []
    for per_day in DAYS:
        peak = per_day / 86400 * args.peak  # notifications/s in the peak hour
        web_cores = math.ceil(peak * web / args.utilisation)
        worker_cores = math.ceil(peak * workers / args.utilisation)
        db_cores = math.ceil(peak * database / args.utilisation)
        # one pool process per worker core, one server process per web core
        connections = math.ceil(
            worker_cores * per_process["worker"] + web_cores * per_process["web"]
        )
        kept = per_day * args.retention
        partitions = 2 ** math.ceil(math.log2(max(1.0, kept / args.rows_per_partition)))
        rows.append(
            [
                f"{per_day / 1e6:g}M/day",
                f"{peak:.0f}",
                str(web_cores),
                str(worker_cores),
                str(db_cores),
                str(connections),
                f"{per_day * wal / 1e9:.1f}",
                f"{kept * stored / 1e12:.2f}",
                "none" if partitions == 1 else str(partitions),
            ]
        )
    return (
        f"Sizing: peak = {args.peak:g} x the day's average; cores at {args.utilisation:.0%} "
        f"busy; {args.retention} days kept; at most {args.rows_per_partition / 1e6:g}M rows "
        "per partition\n"
        + table(
            [
                "volume",
                "peak/s",
                "web cores",
                "worker cores",
                "PostgreSQL cores",
                "connections",
                "WAL GB/day",
                "stored TB",
                "partitions",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
