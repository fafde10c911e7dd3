"""HTTP ingest: `clarion web` against the least an endpoint on the same stack can do, in one run.

    .venv/bin/python bench/ingest.py [--requests 2000] [--clients 8,32] [--workers 1] [--batch 500]

Two servers, each with `--workers` server processes, on the same PostgreSQL:

  clarion   `clarion web` (the documented command): API key check, validation, notify() with the
            outbox row, 202 after the commit. Single-event `POST /v1/events`.
  baseline  bench/ingest_baseline.py under uvicorn: one INSERT … ON CONFLICT DO NOTHING per
            request, autocommit, eight pooled connections per process, 202.

For each client count, a closed loop (each client posts as soon as its last answer came) gives
requests/s and p95; then an open loop at half the baseline's rate gives both servers' p95 at the
same offered load, in `--half-rounds` paired rounds (which server goes first alternating; each
`--half-seconds` long): the ratio printed is the median of the rounds' ratios, with their range,
because one short window's p95 on a shared 2-core host moved 1.5-4.8x from round to round. Then the batch door: `--batch`-event `POST /v1/events/batch` against one
multi-row INSERT per `--batch` rows through psycopg, of the same rows (the request rows clarion
wrote, read back, into a table made LIKE clarion.requests: its columns and indexes) and, for
scale, of narrow (event_id, body) rows. Checked afterwards: rows in clarion's ledger =
distinct events sent (nothing lost, nothing doubled), and idempotent replays answer the very bytes
of the first answer. No workers run (ingest alone); `--drain` starts a worker that routes and
sends what arrives, the realistic case.

Services: CLARION_DATABASE_URL / CLARION_REDIS_URL when set, else the embedded PostgreSQL + Redis in
.clarion/bench-ingest. A fresh database per run, dropped at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import say, start_services, table, with_database  # noqa: E402

BIN = Path(sys.executable).parent
CATALOG = ROOT / "tests" / "catalog.yaml"
RECIPIENTS = 1000
ANCHORS = "Knock's top tier takes 1,000 requests/s per customer; Novu Enterprise up to 6,000"


@dataclass
class Run:
    rate: float  # requests/s
    p50: float  # ms
    p95: float
    errors: int
    statuses: dict[int, int]  # the answers that were not 202, by status


def merged(runs: Sequence[Run]) -> Run:
    """Several runs of one server as one row: median rate, p50 and p95; every non-202 counted."""
    statuses = counted(r.statuses for r in runs)
    return Run(
        statistics.median(r.rate for r in runs),
        statistics.median(r.p50 for r in runs),
        statistics.median(r.p95 for r in runs),
        sum(statuses.values()),
        statuses,
    )


def counted(parts: Iterable[dict[int, int]]) -> dict[int, int]:
    """Non-202 statuses of several runs or client processes, added up."""
    total: Counter[int] = Counter()
    for part in parts:
        total.update(part)
    return dict(total)


def non_202(**runs: Run) -> str:
    """The non-202 answers of a row's runs: a count, and which run had which statuses."""
    total = sum(r.errors for r in runs.values())
    detail = ", ".join(f"{name} {r.statuses}" for name, r in runs.items() if r.errors)
    return f"{total} ({detail})" if total else "0"


class Client:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.headers = {"Content-Type": "application/json", **headers}

    def post(
        self, path: str, body: bytes, extra: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        self.conn.request("POST", path, body, {**self.headers, **(extra or {})})
        answer = self.conn.getresponse()
        return answer.status, answer.read()


# Client connections per load process. 32 threads in one Python process made the process's own
# GIL and scheduling delays part of every latency it recorded (bench/RESULTS.md, session 22: a
# round's p95 went to tens of ms for either server), so more clients are spread over processes.
PER_PROCESS = 8


def load(
    port: int,
    headers: dict[str, str],
    bodies: list[bytes],
    clients: int,
    *,
    path: str = "/v1/events",
    rate: float | None = None,
) -> Run:
    """Post every body once from `clients` connections; closed loop, or paced at `rate`/s. Up to
    PER_PROCESS connections run as threads of this process; more are spread over forked ones."""
    procs = -(-clients // PER_PROCESS)
    # every client starts at `start`, closed loop too: the wall clock runs from there (a client
    # that began earlier made short runs look up to 50 ms faster than they were)
    start = time.perf_counter() + (0.05 if procs == 1 else 0.3)
    args = (port, headers, bodies, clients, path, rate, start)
    if procs == 1:
        results = [_clients(range(clients), *args)]
    else:
        ctx = multiprocessing.get_context("fork")
        children = []
        for p in range(procs):
            receive, send = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, args=(send, range(p, clients, procs), *args))
            child.start()
            send.close()
            children.append((child, receive))
        results = []
        for child, receive in children:
            results.append(receive.recv())
            child.join()
    latencies = sorted(took for r in results for took in r[0])
    statuses = counted(theirs for _, theirs, _ in results)
    wall = max(end for _, _, end in results) - start
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return Run(len(bodies) / wall, pick(0.5), pick(0.95), sum(statuses.values()), statuses)


Outcome = tuple[list[float], dict[int, int], float]  # latencies, non-202 statuses, when done


def _child(send: Any, indices: range, *args: Any) -> None:
    send.send(_clients(indices, *args))
    send.close()


def _clients(
    indices: range,
    port: int,
    headers: dict[str, str],
    bodies: list[bytes],
    clients: int,
    path: str,
    rate: float | None,
    start: float,
) -> Outcome:
    """Clients `indices` (of `clients`) as threads of this process, each its own connection."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def work(index: int) -> None:
        client = Client(port, headers)
        mine = bodies[index::clients]
        time.sleep(max(0.0, start - time.perf_counter()))
        for n, body in enumerate(mine):
            if rate:
                due = start + (n * clients + index) / rate
                time.sleep(max(0.0, due - time.perf_counter()))
            t0 = time.perf_counter()
            status, _ = client.post(path, body)
            took = time.perf_counter() - t0
            with lock:
                latencies.append(took)
                if status != 202:
                    statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=work, args=(i,)) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, statuses, time.perf_counter()


def wait_for(port: int, path: str = "/healthz", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing answered on port {port} within {timeout}s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(prefix: str, n: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "user_id": f"u{i % RECIPIENTS}",
                "type": "receipt",
                "event_id": f"{prefix}-{i}",
                "variables": {"order": str(i)},
            }
        ).encode()
        for i in range(n)
    ]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stops: list[Callable[[], None]] = []

    def setup(self) -> None:
        url, handle = start_services("ingest")
        if handle is not None:
            self.stops.append(handle.stop)
            redis_url = handle.redis_url
        else:
            redis_url = os.environ["CLARION_REDIS_URL"]
        import psycopg

        name = f"bench_ingest_{uuid.uuid4().hex[:8]}"
        self.admin = url
        with psycopg.connect(_libpq(url), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.stops.append(lambda: _drop(url, name))
        self.url = with_database(url, name)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CLARION_")},
            "CLARION_DATABASE_URL": self.url,
            "CLARION_REDIS_URL": redis_url,
            "CLARION_WEBHOOK_SECRET": "bench-ingest-secret",
            "CLARION_WEBHOOK_URL": "http://127.0.0.1:9/unused",
            "CLARION_CATALOG": str(CATALOG),
            "CLARION_HOME": str(ROOT / ".clarion" / "bench-ingest" / "home"),
        }
        self.clarion("migrate")
        key = self.clarion(
            "keys", "create", "--name", "bench", "--scope", "events:write", "--rate", "1000000/s"
        )
        self.key = key.splitlines()[0].strip()  # the secret, printed once
        with psycopg.connect(_libpq(self.url), autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_events (event_id text PRIMARY KEY, body jsonb)")
            conn.execute("CREATE TABLE bench_batch (event_id text PRIMARY KEY, body jsonb)")
            # the same rows as the ledger's: its columns, defaults and indexes (not its triggers)
            conn.execute("CREATE TABLE bench_ledger (LIKE clarion.requests INCLUDING ALL)")
            conn.execute(
                "INSERT INTO clarion.recipients (user_id, timezone, created_at, updated_at) "
                "SELECT 'u' || i, 'UTC', now(), now() FROM generate_series(0, %s) AS i",
                (RECIPIENTS - 1,),
            )

    def clarion(self, *argv: str) -> str:
        done = subprocess.run(
            [str(BIN / "clarion"), *argv], env=self.env, capture_output=True, text=True, check=False
        )
        if done.returncode:
            raise SystemExit(f"clarion {' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def serve(self, argv: list[str], env: dict[str, str]) -> int:
        port = free_port()
        proc = subprocess.Popen(
            [*argv, "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        self.stops.append(lambda: (proc.terminate(), proc.wait(10)))  # type: ignore[arg-type, func-returns-value]
        return port

    def stop(self) -> None:
        while self.stops:
            try:
                self.stops.pop()()
            except Exception as exc:  # noqa: BLE001 - clean up the rest regardless
                say(f"cleanup: {exc}")


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _drop(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def count(url: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(_libpq(url)) as conn:
        row = conn.execute(sql).fetchone()
        return int(row[0]) if row else 0


def replays_exact(port: int, headers: dict[str, str], n: int = 50) -> bool:
    client = Client(port, headers)
    for i, body in enumerate(events("replay", n)):
        key = {"Idempotency-Key": f"bench-replay-{i}"}
        first = client.post("/v1/events", body, key)
        again = client.post("/v1/events", body, key)
        if first != again or first[0] != 202:
            return False
    return True


# The ledger's own columns of a request row, as clarion's batch door wrote them.
LEDGER_COLUMNS = (
    "user_id, type_key, occurrence_key, lane, template_version, variables, locale, state, "
    "due_at, created_at"
)


def batch_insert_rate(
    url: str, table_name: str, columns: str, rows: Sequence[tuple[object, ...]], size: int
) -> float:
    """Rows/s of one multi-row INSERT … ON CONFLICT DO NOTHING per `size` rows, one commit each."""
    import psycopg
    from psycopg.types.json import Jsonb

    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        t0 = time.perf_counter()
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            values = ",".join(["(" + ", ".join(["%s"] * len(chunk[0])) + ")"] * len(chunk))
            flat = [Jsonb(v) if isinstance(v, dict) else v for row in chunk for v in row]
            conn.execute(
                f"INSERT INTO {table_name} ({columns}) VALUES {values} ON CONFLICT DO NOTHING",
                flat,
            )
        return len(rows) / (time.perf_counter() - t0)


def ledger_rows(url: str, prefix: str) -> list[tuple[object, ...]]:
    """The request rows clarion wrote for the events whose ids start with `prefix`, in order."""
    import psycopg

    with psycopg.connect(_libpq(url)) as conn:
        return conn.execute(
            f"SELECT {LEDGER_COLUMNS} FROM clarion.requests WHERE occurrence_key LIKE %s ORDER BY id",
            (f"event:{prefix}%",),
        ).fetchall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--workers", type=int, default=1, help="server processes per server")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--drain", action="store_true", help="a worker routes and sends meanwhile")
    parser.add_argument(
        "--half-rounds", type=int, default=5, help="paired rounds at half the baseline's rate"
    )
    parser.add_argument("--half-seconds", type=float, default=3.0, help="seconds a half-rate round")
    args = parser.parse_args(argv)
    bench = Bench(args)
    try:
        return _run(bench, args)
    finally:
        bench.stop()


def _run(bench: Bench, args: argparse.Namespace) -> int:
    bench.setup()
    workers = ["--workers", str(args.workers)]
    clarion_port = bench.serve(
        [str(BIN / "clarion"), "web", "--host", "127.0.0.1", *workers], bench.env
    )
    base_env = {**bench.env, "BENCH_BASELINE_URL": _libpq(bench.url)}
    base_argv = [str(BIN / "uvicorn"), "bench.ingest_baseline:app", "--log-level", "warning"]
    base_port = bench.serve([*base_argv, "--host", "127.0.0.1", *workers], base_env)
    if args.drain:
        bench.serve([str(BIN / "clarion"), "worker", "--lane", "transactional,control"], bench.env)
        bench.serve([str(BIN / "clarion"), "beat"], bench.env)
    wait_for(clarion_port)
    wait_for(base_port, "/v1/events-missing")
    auth = {"Authorization": f"Bearer {bench.key}"}
    load(clarion_port, auth, events("warm", 200), 8)  # connections and plans warm
    load(base_port, {}, events("warm", 200), 8)
    rows, sent = [], 200
    for clients in [int(c) for c in args.clients.split(",")]:
        ours = load(clarion_port, auth, events(f"c{clients}", args.requests), clients)
        base = load(base_port, {}, events(f"c{clients}", args.requests), clients)
        sent += args.requests
        half = base.rate / 2
        n_half = max(200, int(half * args.half_seconds))
        halves = []  # (clarion, baseline) per round, which server goes first alternating
        for r in range(args.half_rounds):
            bodies = events(f"h{clients}-{r}", n_half)
            if r % 2:
                theirs = load(base_port, {}, bodies, clients, rate=half)
                halves.append((load(clarion_port, auth, bodies, clients, rate=half), theirs))
            else:
                ours_first = load(clarion_port, auth, bodies, clients, rate=half)
                halves.append((ours_first, load(base_port, {}, bodies, clients, rate=half)))
            sent += n_half
        ratios = sorted(o.p95 / b.p95 for o, b in halves)
        ours_half, base_half = merged([o for o, _ in halves]), merged([b for _, b in halves])
        rows.append(
            [
                f"{clients} clients",
                f"{ours.rate:.0f}",
                f"{base.rate:.0f}",
                f"{ours.rate / base.rate:.2f}x",
                f"{ours.p95:.1f}",
                f"{base.p95:.1f}",
                f"{half:.0f}/s: {ours_half.p95:.1f} vs {base_half.p95:.1f}, "
                f"ratio {statistics.median(ratios):.2f}x (rounds {ratios[0]:.2f}-{ratios[-1]:.2f})",
                non_202(
                    clarion=ours, baseline=base, clarion_half=ours_half, baseline_half=base_half
                ),
            ]
        )
    say(
        table(
            [
                "single events",
                "clarion req/s",
                "baseline req/s",
                "ratio",
                "clarion p95 ms",
                "baseline p95 ms",
                "p95 at half the baseline's rate",
                "non-202",
            ],
            rows,
        )
    )
    say(f"(for scale: {ANCHORS})")
    n_batch = args.batch * args.batches
    bodies = [
        json.dumps({"items": [json.loads(b) for b in events(f"batch{j}", args.batch)]}).encode()
        for j in range(args.batches)
    ]
    ours = load(clarion_port, auth, bodies, 1, path="/v1/events/batch")
    sent += n_batch
    ours_rows = ours.rate * args.batch
    same = ledger_rows(bench.url, "batch")
    plain = batch_insert_rate(bench.url, "bench_ledger", LEDGER_COLUMNS, same, args.batch)
    pairs = [(f"b{i}", {"i": i}) for i in range(n_batch)]
    narrow = batch_insert_rate(bench.url, "bench_batch", "event_id, body", pairs, args.batch)
    say(
        table(
            [
                "batch door",
                "clarion rows/s",
                "INSERT of the same rows/s",
                "ratio",
                "INSERT of (event_id, body)/s",
                "ratio",
                "non-202",
            ],
            [
                [
                    f"{args.batch} a request",
                    f"{ours_rows:.0f}",
                    f"{plain:.0f}",
                    f"{ours_rows / plain:.2f}x",
                    f"{narrow:.0f}",
                    f"{ours_rows / narrow:.2f}x",
                    non_202(clarion=ours),
                ]
            ],
        )
    )
    if len(same) != n_batch:
        say(f"the batch door's rows: {len(same)} of {n_batch} (MISMATCH)")
    stored = count(
        bench.url, "SELECT count(*) FROM clarion.requests WHERE occurrence_key NOT LIKE 'replay-%'"
    )
    exact = replays_exact(clarion_port, auth)
    say(
        f"ledger: {stored} requests for {sent} distinct events sent ({'none lost or doubled' if stored == sent else 'MISMATCH'}); idempotent replays exact: {exact}"
    )
    return 0 if stored == sent and exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
