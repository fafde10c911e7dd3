"""What an idle deployment costs: CPU and log lines of clarion's processes with nothing to do.

    .venv/bin/python bench/idle.py [--seconds 600] [--concurrency 2]

Starts the documented deployment (docs/operations/index.md) on a fresh, migrated database with no
series, no requests and no traffic: `clarion worker --lane transactional`, `--lane activation`,
`--lane control`, `clarion beat` and `clarion web`. Once every worker answers `clarion ping`, it
waits 30 s to settle, then measures for `--seconds`: CPU seconds of every process and its
children (from /proc: utime + stime), the database's transactions (pg_stat_database), and the
lines each process wrote at INFO or above. Then the same for the baseline: a bare Celery worker
(bench/noop.py, clarion's reliability settings, the same pool size) and `celery beat` sending its
no-op task every second, the cost of a Celery deployment with a one-second clock and nothing else.

Services: CLARION_DATABASE_URL / CLARION_REDIS_URL when set, else the embedded PostgreSQL + Redis
in .clarion/bench-idle. A fresh database per run, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import say, start_services, table, with_database  # noqa: E402

BIN = Path(sys.executable).parent
TICKS = os.sysconf("SC_CLK_TCK")
LEVEL = re.compile(r"\b(INFO|WARNING|ERROR|CRITICAL)\b")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree(pid: int) -> list[int]:
    """`pid` and every descendant (from /proc/*/stat's parent field)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(parents.get(p, []))
    return found


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def logged(path: Path) -> int:
    """Lines at INFO or above in a process's log."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return sum(1 for line in text.splitlines() if LEVEL.search(line))


class Deployment:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str]) -> None:
        out = (self.logs / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=out, stderr=out, cwd=ROOT)

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(tree(p.pid)) for name, p in self.procs.items()}

    def lines(self) -> dict[str, int]:
        return {name: logged(self.logs / f"{name}.log") for name in self.procs}

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def transactions(url: str) -> int:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


def measure(
    dep: Deployment, url: str, seconds: float
) -> tuple[dict[str, float], dict[str, int], int]:
    cpu0, lines0, tx0 = dep.cpu(), dep.lines(), transactions(url)
    time.sleep(seconds)
    cpu1, lines1, tx1 = dep.cpu(), dep.lines(), transactions(url)
    return (
        {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1},
        {k: lines1[k] - lines0.get(k, 0) for k in lines1},
        tx1 - tx0 - 2,  # the two reads of the counter
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args(argv)
    url, handle = start_services("idle")
    redis_url = handle.redis_url if handle else os.environ["CLARION_REDIS_URL"]
    import psycopg

    name = f"bench_idle_{uuid.uuid4().hex[:8]}"
    admin = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db = with_database(url, name)
    home = ROOT / ".clarion" / "bench-idle" / name
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLARION_")},
        "CLARION_DATABASE_URL": db,
        "CLARION_REDIS_URL": redis_url,
        "CLARION_WEBHOOK_SECRET": "bench-idle-secret",
        "CLARION_HOME": str(home),
        # a deployment names its catalog (unset, each process warns once that it runs the demo)
        "CLARION_CATALOG": str(ROOT / "clarion" / "catalog" / "examples" / "demo.yaml"),
    }
    rows = []
    try:
        subprocess.run([str(BIN / "clarion"), "migrate"], env=env, check=True, capture_output=True)
        ours = Deployment(env, home / "logs")
        c = str(args.concurrency)
        for lane in ("transactional", "activation", "control"):
            conc = "1" if lane == "control" else c
            ours.start(lane, [str(BIN / "clarion"), "worker", "--lane", lane, "-c", conc])
        ours.start("beat", [str(BIN / "clarion"), "beat"])
        ours.start(
            "web", [str(BIN / "clarion"), "web", "--host", "127.0.0.1", "--port", str(free_port())]
        )
        lanes = ["--lane", "transactional", "--lane", "activation", "--lane", "control"]
        ping = [str(BIN / "clarion"), "ping", *lanes, "--timeout", "3"]
        deadline = time.monotonic() + 120
        while subprocess.run(ping, env=env, capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise SystemExit("the workers never answered clarion ping")
            time.sleep(1)
        time.sleep(args.settle)
        cpu, lines, tx = measure(ours, db, args.seconds)
        ours.stop()
        for k in cpu:
            rows.append([f"clarion {k}", f"{100 * cpu[k] / args.seconds:.2f}%", str(lines[k])])
        ours_total = sum(cpu.values())
        rows.append(
            [
                "clarion, together",
                f"{100 * ours_total / args.seconds:.2f}%",
                str(sum(lines.values())),
            ]
        )
        rows.append(["  database transactions/s", f"{tx / args.seconds:.1f}", ""])

        bare = Deployment(env, home / "logs-bare")
        celery = [str(BIN / "celery"), "-A", "bench.noop"]
        bare.start("worker", [*celery, "worker", "-Q", "bench_noop", "-c", c, "--loglevel", "INFO"])
        beat_conf = home / "beat-schedule"
        bare.start(
            "beat",
            [*celery, "beat", "-s", str(beat_conf), "--loglevel", "INFO", "--max-interval", "1"],
        )
        time.sleep(args.settle)
        cpu_b, lines_b, _ = measure(bare, db, args.seconds)
        bare.stop()
        for k in cpu_b:
            rows.append(
                [f"bare celery {k}", f"{100 * cpu_b[k] / args.seconds:.2f}%", str(lines_b[k])]
            )
        rows.append(
            [
                "bare celery, together",
                f"{100 * sum(cpu_b.values()) / args.seconds:.2f}%",
                str(sum(lines_b.values())),
            ]
        )
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if handle is not None:
            handle.stop()
    say(
        f"idle for {args.seconds:.0f} s (after {args.settle:.0f} s to settle); CPU as a share of one core"
    )
    say(table(["process", "CPU", "lines at INFO+"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
