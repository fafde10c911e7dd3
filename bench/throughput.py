"""Throughput: clarion end to end against raw Celery, a naive sender and the seed's design, in one run.

    cd /work/main && .venv/bin/python bench/throughput.py [--n 5000] [--workers 2] [--concurrency 2]

Four phases on the same broker, with the same number of worker processes and pool size:

  raw celery  N no-op tasks, one message each (`.delay()`), consumed by `celery worker` processes
              of a tiny separate app (bench/noop.py) with clarion's reliability settings; each
              task does one Redis INCR, and the clock stops when the counter reaches N. Then the
              same workers drain N messages queued beforehand ("consume-only"): the consumers'
              own rate, without the single publishing thread setting the pace.
  clarion     N distinct `receipt` occurrences through `notify_many` (in chunks), real clarion
              workers on transactional,activation,control plus beat, webhook channel into an
              standins.receiver.Receiver; the clock stops when all N idempotency keys arrived.
              Before it (not timed), 6 batches per pool process: steady state, with each
              process's connections open and its prepared statements past PostgreSQL's first
              five custom plans (raw Celery's workers are warmed with no-ops the same way).
  naive       workers x concurrency processes doing "SELECT 1 ...; if absent: POST; INSERT"
              (no unique constraint) over the same N occurrences, each handed to two processes
              (a redelivered message / duplicated event), into a second Receiver.
  seed        the design clarion's seed describes (bench/seed.py): the same processes and copies,
              but Redis SET NX with a 24 h TTL before each POST and a unique constraint on the
              sent table as backstop; its own Redis (no persistence) is restarted when half the
              occurrences arrived. `--seed-lag L` hands out each second copy L items later (a
              redelivery after a visibility timeout) instead of at the same time.

Services: CLARION_DATABASE_URL / CLARION_REDIS_URL (and CLARION_BROKER_URL) when set, else the
embedded PostgreSQL + Redis in .clarion/bench (started here, and stopped at the end if started
here). Each run makes a fresh database, migrates it, and drops it at the end. Worker logs are kept
in .clarion/bench/logs/<run>/.

Besides items/s, each phase reports CPU ms per item (workers, PostgreSQL, Redis, this process)
and how busy the machine was, other processes included: on a small shared machine the rates
follow the CPU left over, so CPU per item is the steadier number. --rounds R repeats the phases
and reports median ratios; --profile DIR records py-spy stacks of every process while each
phase is timed and prints which statements the time went to (py-spy: .venv/bin/pip install py-spy).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench.*` helpers; clarion itself is installed in the venv

CLARION_QUEUES = ("transactional", "activation", "control")
STOP = threading.Event()  # set on the way out: publishing threads stop early
TYPE_KEY = "receipt"
WARM_BATCHES = 6  # per clarion pool process, before the timed phase
CHANNEL = "webhook"


# --- results ----------------------------------------------------------------------------------


@dataclass
class Result:
    key: str  # raw | drain | clarion | naive
    name: str
    items: int  # occurrences (or tasks) that had to complete
    completed: int
    elapsed: float
    publish_seconds: float = 0.0  # time the producer side took (inside `elapsed`)
    duplicates: int | None = None  # arrivals beyond the first per idempotency key
    duplicate_occurrences: int | None = None  # occurrences that arrived under >1 distinct key
    notes: list[str] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)  # py-spy summary (--profile)
    cpu_ms: float | None = None  # CPU ms per item, all components we can see (CpuMeter)

    @property
    def rate(self) -> float:
        return self.completed / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.completed >= self.items


# --- small helpers ----------------------------------------------------------------------------


class Progress:
    """One self-overwriting status line on a terminal, a line every few seconds otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < (0.25 if self.tty else 3.0):
            return
        self.last = now
        line = f"  [{self.label}] {text}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self, text: str) -> None:
        self.show(text, force=True)
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def say(text: str) -> None:
    print(text, flush=True)


def _with_database(url: str, name: str) -> str:
    from sqlalchemy import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _libpq(url: str) -> str:
    """A SQLAlchemy-style URL as a plain postgresql:// URI for psycopg.connect."""
    from sqlalchemy import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _wait_for_workers(app, names: list[str], processes: list, timeout: float = 90) -> None:
    """Until every named worker answers a ping (its pool is up and it consumes)."""
    import kombu.pools

    # Fresh connections: in a second round, pooled ones left by the other app's phase (both apps
    # share kombu's pools) never saw the pidbox replies, and the ping timed out.
    kombu.pools.reset()
    app._after_fork()
    deadline = time.monotonic() + timeout
    missing = set(names)
    while time.monotonic() < deadline:
        dead = [p for p in processes if not p.alive()]
        if dead:
            raise RuntimeError(f"worker exited at start-up; see {dead[0].log}")
        with contextlib.suppress(Exception):
            for reply in app.control.ping(destination=list(missing), timeout=1.0) or []:
                missing -= {n for n in reply if n in missing}
        if not missing:
            return
    raise RuntimeError(f"workers did not answer a ping within {timeout:.0f}s: {sorted(missing)}")


def _queue_sizes(app, queues) -> dict[str, int]:
    sizes = {}
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for q in queues:
            try:
                sizes[q] = channel.queue_declare(queue=q, passive=True).message_count
            except Exception:  # not declared yet: empty
                sizes[q] = 0
    return sizes


def _purge(app, queues) -> None:
    with app.connection_for_write() as conn:
        for q in queues:
            conn.default_channel.queue_purge(q)


def _hostname(name: str) -> str:
    import socket

    return f"{name}@{socket.gethostname()}"


# --- CPU accounting ---------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of its reaped children), from /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    # after "(comm) ": state, ppid, ...; [11:15] are utime, stime, cutime, cstime in clock ticks
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / _TICK


def _tree_cpu(roots: list[int]) -> float:
    """CPU seconds used by the processes under `roots` (live ones and those already reaped)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            stats[int(entry)] = st
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _) in stats.items():
        children[ppid].append(pid)
    total, todo, seen = 0.0, [r for r in roots if r in stats], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo += children.get(pid, [])
    return total


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine (all CPUs), from /proc/stat."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:7]) - idle) / _TICK  # user..softirq; steal is no one here


class CpuMeter:
    """CPU seconds per component over a timed phase: process trees (workers, PostgreSQL, Redis),
    this process (producer + receiver threads), and the whole machine (to show other load)."""

    def __init__(self, trees: dict[str, list[int]]) -> None:
        import resource

        self.resource = resource
        self.trees = {k: v for k, v in trees.items() if v}
        self.start = self._now()
        self.per_item: float | None = None

    def _now(self) -> dict[str, float]:
        me = self.resource.getrusage(self.resource.RUSAGE_SELF)
        values = {label: _tree_cpu(roots) for label, roots in self.trees.items()}
        values["bench process"] = me.ru_utime + me.ru_stime
        values["machine"] = _machine_busy()
        return values

    def stop(self, elapsed: float, items: int, extra: dict[str, float] | None = None) -> list[str]:
        """`extra`: CPU seconds measured elsewhere (processes that exit before this is called)."""
        end = self._now()
        used = {k: max(0.0, end[k] - self.start.get(k, 0.0)) for k in end}
        machine = used.pop("machine")
        used.update(extra or {})
        ours = sum(used.values())
        self.per_item = ours / items * 1000
        cpus = os.cpu_count() or 1
        parts = ", ".join(f"{k} {v / items * 1000:.2f}" for k, v in used.items())
        return [
            f"CPU ms per item: {parts}; total {ours / items * 1000:.2f} "
            f"({ours:.1f} CPU-s in {elapsed:.1f}s; machine busy {machine / (elapsed * cpus):.0%} "
            f"of {cpus} CPUs, {max(0.0, machine - ours) / (elapsed * cpus):.0%} by other processes)"
        ]


def _server_pids(db_url: str, redis_url: str) -> tuple[list[int], list[int]]:
    """PostgreSQL postmaster and Redis server pids, when they run on this machine."""
    import psycopg
    import redis

    pg: list[int] = []
    rd: list[int] = []
    with contextlib.suppress(Exception), psycopg.connect(_libpq(db_url)) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        if (st := _stat(backend)) is not None:
            pg = [st[0]]
    with contextlib.suppress(Exception):
        pid = int(redis.Redis.from_url(redis_url).info("server")["process_id"])
        if _stat(pid) is not None:
            rd = [pid]
    return pg, rd


_TASK_DONE = re.compile(r"Task (\S+)\[[0-9a-f-]+\] succeeded in ([0-9.]+)s")
_TASK_RECEIVED = re.compile(r"Task (\S+)\[[0-9a-f-]+\] received")


def _task_stats(logs: list[Path], offsets: dict[Path, int]) -> dict[str, dict[str, float]]:
    """Per task name: messages received, tasks finished and their summed / max run time, from the
    INFO lines Celery workers log (only what was logged after `offsets`)."""
    stats: dict[str, dict[str, float]] = defaultdict(lambda: Counter())  # type: ignore[arg-type, return-value]
    for log in logs:
        with open(log, "rb") as f:
            f.seek(offsets.get(log, 0))
            for raw in f:
                line = raw.decode(errors="replace")
                if m := _TASK_DONE.search(line):
                    s = stats[m.group(1)]
                    seconds = float(m.group(2))
                    s["done"] += 1
                    s["seconds"] += seconds
                    s["max"] = max(s["max"], seconds)
                elif m := _TASK_RECEIVED.search(line):
                    stats[m.group(1)]["received"] += 1
    return stats


class Profiler:
    """py-spy `record` on some processes (and their children) while a phase is timed, into raw
    collapsed stacks (`--profile DIR`); summarised by `profile_summary`."""

    def __init__(
        self,
        out_dir: Path | None,
        label: str,
        pids: list[int],
        rate: int,
        idle: bool = True,
        gil: bool = False,
    ) -> None:
        import shutil
        import subprocess

        self.files: list[Path] = []
        self.procs: list = []
        if out_dir is None:
            return
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
        out_dir.mkdir(parents=True, exist_ok=True)
        for i, pid in enumerate(pids):
            out = out_dir / f"{label}-{i}.txt"
            log = open(out_dir / f"{label}-{i}.log", "wb")  # noqa: SIM115 - handed to the child
            self.procs.append(
                subprocess.Popen(
                    [
                        exe,
                        "record",
                        "--pid",
                        str(pid),
                        "--subprocesses",
                        "--nonblocking",
                        *(["--idle"] if idle else []),
                        *(["--gil"] if gil else []),
                        "--rate",
                        str(rate),
                        "--format",
                        "raw",
                        "-o",
                        str(out),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()
            self.files.append(out)
        time.sleep(1.0)  # py-spy needs a moment to attach

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for p in self.procs:
            try:
                p.wait(30)
            except Exception:
                p.kill()
                p.wait()
        self.procs = []

    def summary(self) -> list[str]:
        self.stop()
        return profile_summary(self.files) if self.files else []


_PROCESS = re.compile(r'process \d+:"([^"]*)";?')


def _role(commands: list[str]) -> str:
    command = commands[-1] if commands else ""
    if "throughput.py" in command:
        return "bench process (producer)"
    if " beat" in command:
        return "celery beat"
    if "multiprocessing" in command:
        return "naive process"
    if " worker" in command:
        return "worker pool child" if len(commands) > 1 else "worker main process"
    return "other"


_OURS = re.compile(r"\((tasks|db|adapters|gates|catalog|clarion|bench|ops)/")
_WORK_MARKERS = {
    "worker pool child": "build_tracer.<locals>.trace_task (",  # inside a Celery task
    "bench process (producer)": "publish (bench/throughput.py",  # the timed publishing loop
    "naive process": "work (bench/naive.py",  # the naive loop
}


def profile_summary(files: list[Path], top: int = 8) -> list[str]:
    """Where the time went, from py-spy raw stacks (waiting included in --profile-mode wall). Per
    process role: the share of samples spent doing the timed work; the heaviest lines of our own
    code there (inclusive); and the leaf frames (self: what it was waiting on or running)."""
    samples: Counter = Counter()
    busy: Counter = Counter()
    ours: dict[str, Counter] = defaultdict(Counter)
    leaves: dict[str, Counter] = defaultdict(Counter)
    for path in files:
        if not path.exists():
            continue
        for raw in path.read_bytes().decode(errors="replace").splitlines():
            stack, _, count = raw.rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            commands = []
            while m := _PROCESS.match(stack):  # process frames come first; commands may hold ";"
                commands.append(m.group(1))
                stack = stack[m.end() :]
            parts = [part for part in stack.split(";") if not part.startswith("thread ")]
            role = _role(commands)
            samples[role] += n
            marker = _WORK_MARKERS.get(role)
            start = next((i for i, f in enumerate(parts) if marker and marker in f), None)
            if start is None:
                continue
            busy[role] += n
            for frame in {f for f in parts[start:] if _OURS.search(f)}:
                ours[role][frame] += n
            leaves[role][parts[-1]] += n
    lines = []
    for role, total in samples.most_common():
        work = busy[role]
        if not work:
            continue
        lines.append(
            f"{role}: {work} of {total} samples in the timed work ({work / total:.0%}); "
            "our code there, inclusive:"
        )
        lines += [f"    {n / work:6.1%}  {frame}" for frame, n in ours[role].most_common(top)]
        lines.append("  leaf frames (self):")
        lines += [
            f"    {n / work:6.1%}  {frame}" for frame, n in leaves[role].most_common(top // 2 + 2)
        ]
    return lines


class Cleanup:
    """Stops what the benchmark started, newest first, even on Ctrl-C or an exception."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()

    def add(self, fn: Callable, *args) -> None:
        self.stack.callback(self._quietly, fn, *args)

    @staticmethod
    def _quietly(fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # keep stopping the rest
            print(f"  cleanup: {getattr(fn, '__qualname__', fn)} failed: {exc}", file=sys.stderr)

    def close(self) -> None:
        STOP.set()
        # A second Ctrl-C must not interrupt the stopping of processes.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.stack.close()
        finally:
            signal.signal(signal.SIGINT, previous)


def _stop_all(processes: list) -> None:
    for p in reversed(processes):  # beat (started last) first, so it leaves no tick behind
        p.stop()  # warm shutdown, SIGKILL for the whole process group after 15 s


# --- the run ----------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, cleanup: Cleanup) -> None:
        self.args = args
        self.cleanup = cleanup
        self.run_id = uuid.uuid4().hex[:8]
        self.tag = self.run_id  # run id + round: keeps keys, names and logs of rounds apart
        self.round = 1
        self.home = ROOT / ".clarion" / "bench"
        self.logs = self.home / "logs" / self.run_id
        self.embedded = False
        self.queues: tuple[str, ...] = CLARION_QUEUES  # the clarion phase's sending workers

    # services and database

    def services(self) -> None:
        db_url = os.environ.get("CLARION_DATABASE_URL")
        redis_url = os.environ.get("CLARION_REDIS_URL")
        if not (db_url and redis_url):
            from clarion.db.embedded import ensure_running

            say(f"services: embedded PostgreSQL + Redis in {self.home.relative_to(ROOT)}")
            handle = ensure_running(self.home)
            if handle.process is not None:
                self.cleanup.add(handle.stop)
            else:
                say("  (reusing embedded services already running there; they stay up)")
            db_url = db_url or handle.database_url
            redis_url = redis_url or handle.redis_url
            self.embedded = True
        else:
            say("services: CLARION_DATABASE_URL / CLARION_REDIS_URL")
        self.server_url, self.redis_url = db_url, redis_url
        self.broker_url = os.environ.get("CLARION_BROKER_URL") or redis_url

    def database(self) -> None:
        from sqlalchemy import text

        from clarion.db.engine import migrate, one_off_engine

        self.db_name = f"clarion_bench_{self.run_id}"
        admin = one_off_engine(self.server_url)
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.db_name}"'))
        self.cleanup.add(self._drop_database, admin)
        self.db_url = _with_database(self.server_url, self.db_name)
        migrate(self.db_url)
        say(f"database: {self.db_name} (fresh, migrated; dropped at the end)")
        if self.args.event_endpoint:
            self._event_endpoint()
        self.pg_pids, self.redis_pids = _server_pids(self.db_url, self.redis_url)

    def _event_endpoint(self) -> None:
        """An app endpoint wanting every event kind (--event-endpoint): each change the phase
        makes writes its outbound event and send rows (migration 0023's triggers). No events
        worker runs, so this measures the outbox's cost on the sending path, not the posting."""
        from datetime import UTC, datetime

        from sqlalchemy import text

        from clarion import settings
        from clarion.adapters.standard_webhooks import new_secret
        from clarion.db import outbound
        from clarion.db.engine import one_off_engine
        from clarion.db.schema import EVENT_KINDS

        with one_off_engine(self.db_url).connect() as conn:
            conn.execute(text(f'SET search_path TO "{settings.get().schema}"'))
            outbound.create_endpoint(
                conn,
                url="http://127.0.0.1:9/",
                kinds=EVENT_KINDS,
                secret=new_secret(),
                description="bench",
                now=datetime.now(UTC),
            )
        say("  an app endpoint wants every event kind: each change writes its outbox rows")

    def _drop_database(self, admin) -> None:
        from sqlalchemy import text

        from clarion.db import engine

        engine.dispose_all()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))
        admin.dispose()

    def environment(self) -> None:
        """Point this process and every child at the bench database (CLARION_* variables)."""
        from clarion import settings
        from clarion.tasks import runtime

        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {
            "CLARION_HOME": str(self.logs),
            "CLARION_DATABASE_URL": self.db_url,
            "CLARION_REDIS_URL": self.redis_url,
            "CLARION_BROKER_URL": self.broker_url,
            "CLARION_CATALOG": str(ROOT / "tests" / "catalog.yaml"),
            # with a database URL the public development secret is refused
            "CLARION_WEBHOOK_SECRET": os.environ.get("CLARION_WEBHOOK_SECRET")
            or "clarion-bench-secret",
        }
        os.environ.update(self.env)
        settings.reset()
        runtime.reset()
        self.secret = settings.get().webhook_secret

    def empty_queues(self, app, queues) -> None:
        """Start from empty queues: purge them on the embedded broker; elsewhere refuse to run on
        queues that hold someone's messages."""
        sizes = {q: n for q, n in _queue_sizes(app, queues).items() if n}
        if not sizes:
            return
        if not self.embedded and not self.args.purge:
            raise SystemExit(
                f"the broker's queues are not empty ({sizes}); use a dedicated Redis "
                "or pass --purge to drop those messages"
            )
        _purge(app, sizes)
        say(f"  purged leftover messages: {sizes}")

    def profiler(self, label: str, pids: list[int]) -> Profiler:
        """py-spy on `pids` and this process while a phase is timed (only with --profile)."""
        a = self.args
        profiler = Profiler(
            a.profile,
            f"r{self.round}-{label}",
            [*pids, os.getpid()],
            a.profile_rate,
            idle=a.profile_mode == "wall",
            gil=a.profile_mode == "gil",
        )
        self.cleanup.add(profiler.stop)
        return profiler

    def start(
        self,
        command: list[str],
        log_name: str,
        processes: list,
        *,
        env: dict[str, str] | None = None,
    ):
        from clarion.ops.launch import Process

        process = Process(
            command, env={**self.env, **(env or {})}, log=self.logs / log_name, cwd=ROOT
        )
        processes.append(process)
        return process

    # (a) raw celery

    def raw_celery(self) -> list[Result]:
        import redis

        from bench import noop

        # noop.app took celeryconfig's broker when first imported, maybe before this run's
        # settings were set (then Celery's default, amqp://localhost): the workers get ours
        noop.app.conf.broker_url = self.broker_url
        a = self.args
        say(
            f"\n(a) raw Celery: {a.n} no-op tasks, one message each, "
            f"{a.workers} worker(s) x -c {a.concurrency} ({a.pool})"
        )
        self.empty_queues(noop.app, [noop.QUEUE])
        self.cleanup.add(_purge, noop.app, [noop.QUEUE])  # runs after the workers stopped
        r = redis.Redis.from_url(self.redis_url)
        counter = f"bench:{self.tag}:noop"
        warm, drained = f"{counter}:warm", f"{counter}:drain"
        self.cleanup.add(r.delete, counter, warm, drained)
        processes: list = []
        self.cleanup.add(_stop_all, processes)
        names = []
        for i in range(a.workers):
            name = f"bnoop{self.tag}-{i}"
            names.append(_hostname(name))
            self.start(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "bench.noop",
                    "worker",
                    "-Q",
                    noop.QUEUE,
                    "-c",
                    str(a.concurrency),
                    "-P",
                    a.pool,
                    "-n",
                    f"{name}@%h",
                    "--loglevel",
                    "WARNING",
                    "--without-mingle",
                    "--without-gossip",
                ],
                f"r{self.round}-noop-worker-{i}.log",
                processes,
            )
        _wait_for_workers(noop.app, names, processes)
        warm_n = 4 * a.workers * a.concurrency
        for _ in range(warm_n):
            noop.noop.delay(warm)
        _wait(lambda: int(r.get(warm) or 0) >= warm_n, 60, "no-op warm-up")

        profiler = self.profiler("raw", [p.pid for p in processes])
        published = [0]
        publish_seconds = [0.0]

        def publish() -> None:
            start = time.perf_counter()
            for i in range(a.n):
                if STOP.is_set():
                    return
                noop.noop.delay(counter)  # what a Celery user writes: one message per task
                published[0] = i + 1
            publish_seconds[0] = time.perf_counter() - start

        meter = CpuMeter({"workers": [p.pid for p in processes], "redis": self.redis_pids})
        t0 = time.perf_counter()
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        done, elapsed = _poll(
            Progress("raw celery"),
            lambda: int(r.get(counter) or 0),
            a.n,
            a.timeout,
            lambda done, rate, t: (
                f"published {published[0]}/{a.n}  completed {done}/{a.n}  {rate:,.0f}/s  {t:.1f}s"
            ),
            t0=t0,
        )
        cpu = meter.stop(elapsed, max(done, 1))
        thread.join(5)
        profiler.stop()
        main = Result(
            "raw",
            "raw celery no-op",
            a.n,
            done,
            elapsed,
            publish_seconds[0],
            notes=cpu,
            profile=profiler.summary(),
            cpu_ms=meter.per_item,
        )

        # The same workers with the queue filled beforehand: what the consumers alone can do,
        # without the single publishing thread setting the pace.
        noop.app.control.cancel_consumer(noop.QUEUE, destination=names, reply=True, timeout=5)
        with noop.app.producer_or_acquire() as producer:
            for _ in range(a.n):
                noop.noop.apply_async((drained,), producer=producer)
        meter = CpuMeter({"workers": [p.pid for p in processes], "redis": self.redis_pids})
        t0 = time.perf_counter()
        noop.app.control.add_consumer(noop.QUEUE, destination=names, reply=True, timeout=5)
        done, elapsed = _poll(
            Progress("raw celery, queue pre-filled"),
            lambda: int(r.get(drained) or 0),
            a.n,
            a.timeout,
            lambda done, rate, t: f"completed {done}/{a.n}  {rate:,.0f}/s  {t:.1f}s",
            t0=t0,
        )
        cpu = meter.stop(elapsed, max(done, 1))
        _stop_all(processes)
        drain = Result(
            "drain",
            "raw celery consume-only",
            a.n,
            done,
            elapsed,
            notes=[
                "the same workers draining a queue filled with N no-op messages beforehand "
                "(consumers switched off while filling): the consumer side alone",
                *cpu,
            ],
            cpu_ms=meter.per_item,
        )
        return [main, drain]

    # (b) clarion

    def clarion(self, receiver) -> Result:
        from sqlalchemy import text

        from clarion import settings
        from clarion.db.engine import engine
        from clarion.ops.launch import beat_command, worker_command
        from clarion.records import idempotency_key
        from clarion.tasks import notify_many, register_recipient
        from clarion.tasks.app import app, use_broker

        use_broker(self.broker_url)  # the app read its config before this run's settings were set
        a = self.args
        say(
            f"\n(b) clarion: {a.n} `{TYPE_KEY}` occurrences via notify_many (chunks of {a.chunk}), "
            f"webhook channel, {a.workers} worker(s) x -c {a.concurrency} ({a.pool}) on "
            f"{','.join(self.queues)} + beat"
        )
        queues = (*self.queues, *self.side_queues())
        self.empty_queues(app, queues)
        if self.embedded:  # clarion's queues are ours only on the embedded broker
            self.cleanup.add(_purge, app, queues)  # runs after the workers stopped
        users = [f"u{self.tag}-{i}" for i in range(min(a.recipients, a.n))]
        with engine().begin() as conn:
            for user in users:
                register_recipient(user, timezone="UTC", connection=conn)
        items = [
            dict(
                user_id=users[j % len(users)],
                type_key=TYPE_KEY,
                event_id=f"{self.tag}-{j}",
                variables={"order": j},
            )
            for j in range(a.n)
        ]
        expected = {
            idempotency_key(i["user_id"], TYPE_KEY, f"event:{i['event_id']}", CHANNEL)  # type: ignore[arg-type]
            for i in items
        }
        say(f"  {len(users)} recipients registered")

        processes: list = []
        self.cleanup.add(_stop_all, processes)
        names = []
        logs = []
        for i in range(a.workers):
            name = f"bclarion{self.tag}-{i}"
            names.append(_hostname(name))
            logs.append(self.logs / f"r{self.round}-clarion-worker-{i}.log")
            self.start(
                worker_command(
                    self.queues,
                    concurrency=a.concurrency,
                    name=name,
                    pool=a.pool,
                    loglevel="INFO",
                ),
                logs[-1].name,
                processes,
                env={"CLARION_WEBHOOK_URL": receiver.url},
            )
        names += self.side_workers(processes)
        self.start(beat_command(self.logs), f"r{self.round}-clarion-beat.log", processes)
        _wait_for_workers(app, names, processes)
        self.clarion_workers = processes[:-1]

        # Warm-up (not timed): WARM_BATCHES full batches per pool process, so each has loaded the
        # catalog, opened the database and HTTP connections its senders use, and run every
        # statement past PostgreSQL's first five (custom) plans of a prepared statement: a phase
        # of 5,000 is only a dozen batches per process, and would otherwise time that warm-up.
        arrivals = receiver.arrivals
        warm_n = WARM_BATCHES * a.workers * a.concurrency * settings.get().batch_size
        warm = [
            dict(
                user_id=users[k % len(users)],
                type_key=TYPE_KEY,
                event_id=f"warm-{self.tag}-{k}",
                variables={"order": k},
            )
            for k in range(warm_n)
        ]
        for s in range(0, warm_n, a.chunk):
            notify_many(warm[s : s + a.chunk])
        _wait(lambda: arrivals.unique >= warm_n, 120, "clarion warm-up")
        offsets = {log: log.stat().st_size for log in logs}
        profiler = self.profiler("clarion", [p.pid for p in processes])

        published = [0]
        publish_seconds = [0.0]
        errors: list[BaseException] = []

        def publish() -> None:
            start = time.perf_counter()
            try:
                for s in range(0, a.n, a.chunk):
                    if STOP.is_set():
                        return
                    notify_many(items[s : s + a.chunk])
                    published[0] = min(a.n, s + a.chunk)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
            publish_seconds[0] = time.perf_counter() - start

        meter = CpuMeter(
            {
                "workers+beat": [p.pid for p in processes],
                "postgres": self.pg_pids,
                "redis": self.redis_pids,
            }
        )
        t0 = time.perf_counter()
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        done, elapsed = _poll(
            Progress("clarion"),
            lambda: arrivals.unique - warm_n,
            a.n,
            a.timeout,
            lambda done, rate, t: (
                f"enqueued {published[0]}/{a.n}  arrived {done}/{a.n}  {rate:,.0f}/s  {t:.1f}s"
            ),
            stop=lambda: bool(errors),
            t0=t0,
        )
        cpu = meter.stop(elapsed, max(done, 1))
        thread.join(10)
        if errors:
            raise errors[0]
        profiler.stop()
        time.sleep(a.settle)  # let late repeats (if any) arrive before counting them
        _stop_all(processes)

        with arrivals.lock:
            got = sum(1 for k in expected if arrivals.by_key.get(k))
            repeats = sum(n - 1 for n in arrivals.by_key.values())
            multi = sum(1 for keys in arrivals.occurrences.values() if len(keys) > 1)
        result = Result(
            "clarion",
            "clarion end-to-end",
            a.n,
            got,
            elapsed,
            publish_seconds[0],
            repeats,
            multi,
            notes=cpu,
            profile=profiler.summary(),
            cpu_ms=meter.per_item,
        )

        with engine().connect() as conn:
            states = dict(  # type: ignore[var-annotated]
                conn.execute(text("SELECT state, count(*) FROM deliveries GROUP BY state")).all()
            )
            incidents = dict(  # type: ignore[var-annotated]
                conn.execute(text("SELECT kind, count(*) FROM incidents GROUP BY kind")).all()
            )
            pending = conn.execute(
                text("SELECT count(*) FROM requests WHERE state <> 'routed'")
            ).scalar_one()
        result.notes.append(
            f"deliveries by state: {states}; requests not routed: {pending}; "
            f"incidents: {incidents or 'none'}"
        )
        result.notes += self._clarion_breakdown(_task_stats(logs, offsets), elapsed)
        return result

    def side_queues(self) -> tuple[str, ...]:
        """Queues of workers beside the sending ones (bench/outbound.py: `events`)."""
        return ()

    def side_workers(self, processes: list) -> list[str]:
        """Start workers beside the sending ones (into `processes`); their node names."""
        return []

    def _clarion_breakdown(self, stats, elapsed: float) -> list[str]:
        a = self.args
        slots = a.workers * a.concurrency
        lines = []
        messages = sum(int(s["received"]) for s in stats.values())
        busy = sum(s["seconds"] for s in stats.values())
        lines.append(
            f"messages consumed while timed: {messages} "
            f"({messages / a.n:.3f} per notification); pool busy "
            f"{busy:.2f}s of {elapsed * slots:.2f}s available ({busy / (elapsed * slots):.0%})"
        )
        for name, s in sorted(stats.items()):
            done = int(s["done"])
            if not done:
                continue
            lines.append(
                f"  {name:<16} {int(s['received']):>5} msgs  {s['seconds']:7.2f}s total  "
                f"{s['seconds'] / done * 1000:8.1f} ms/task  max {s['max'] * 1000:7.1f} ms"
            )
        return lines

    # (c) naive and (d) the seed's design: baselines of processes that check, then send

    def naive(self, receiver) -> Result:
        from bench import naive

        say(
            f"\n(c) naive: {self._k()} processes, SELECT-then-POST-then-INSERT (no unique "
            f"constraint), {self.args.n} occurrences each handed to 2 processes "
            f"({2 * self.args.n} work items)"
        )
        conninfo = _libpq(self.db_url)
        return self._baseline(
            receiver,
            key="naive",
            name="naive check-then-send",
            module=naive,
            table="naive_sent",
            args=(conninfo, receiver.url, self.secret),
        )

    def seed(self, receiver) -> Result:
        from bench import seed

        a = self.args
        say(
            f"\n(d) seed design: {self._k()} processes, Redis SET NX (24 h TTL) before each POST, "
            f"unique constraint as backstop, {a.n} occurrences each handed to 2 processes "
            f"(the second copy {a.seed_lag} items later); the Redis is restarted (no persistence) "
            "when half have arrived"
        )
        server = seed.RedisServer(self.logs / f"r{self.round}-seed-redis")
        server.start()
        self.cleanup.add(server.stop)
        conninfo = _libpq(self.db_url)
        ctx = multiprocessing.get_context("spawn")
        caught = ctx.Array("i", self._k())
        restarts: list[float] = []

        def restart(arrived: int) -> None:
            if not restarts and arrived >= a.n // 2:
                restarts.append(server.restart())

        result = self._baseline(
            receiver,
            key="seed",
            name="seed: SET NX + constraint",
            module=seed,
            table="seed_sent",
            args=(conninfo, server.url, receiver.url, self.secret),
            extra={"caught": caught},
            lag=a.seed_lag,
            during=restart,
            ctx=ctx,
        )
        server.stop()
        result.notes.append(
            f"Redis restarted once ({restarts[0]:.2f}s away)"
            if restarts
            else "Redis was not restarted (the phase ended first)"
        )
        result.notes.append(
            f"the unique constraint refused {sum(caught[:])} inserts: each after its POST "
            "(the backstop records a duplicate, it cannot stop it)"
        )
        return result

    def _k(self) -> int:
        return self.args.workers * self.args.concurrency

    def _baseline(
        self,
        receiver,
        *,
        key: str,
        name: str,
        module,
        table: str,
        args: tuple,
        extra: dict | None = None,
        lag: int = 0,
        during: Callable[[int], None] | None = None,
        ctx=None,
    ) -> Result:
        """k processes of `module.work` over the N occurrences, each occurrence handed to two
        of them (a redelivered message, a duplicated event): the second copy `lag` items after
        the first (0: at the same time). `module.work` is called with `args`, then its work
        items, the start barrier and its CPU slot, and `extra` as keywords; `during(arrived)` is
        called while the phase runs."""
        import psycopg

        a = self.args
        k = self._k()
        conninfo = _libpq(self.db_url)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(module.SCHEMA)
        users = [f"u{self.tag}-{i}" for i in range(min(a.recipients, a.n))]
        work: list[list[tuple[str, str, int]]] = [[] for _ in range(k)]
        items = [(users[j % len(users)], f"event:{self.tag}-{j}", j) for j in range(a.n)]
        for t in range(a.n + lag):
            if t < a.n:
                work[t % k].append(items[t])
            if 0 <= t - lag < a.n:  # the second copy, on another process
                j = t - lag
                work[(j + 1) % k if k > 1 else 0].append(items[j])

        ctx = ctx or multiprocessing.get_context("spawn")  # children share no sockets with us
        barrier = ctx.Barrier(k + 1)
        loop_cpu = ctx.Array("d", k)
        procs = [
            ctx.Process(
                target=module.work,
                daemon=True,
                args=(*args, w, barrier, loop_cpu, i),
                kwargs=extra or {},
            )
            for i, w in enumerate(work)
        ]
        self.cleanup.add(_stop_multiprocessing, procs)
        for p in procs:
            p.start()
        profiler = self.profiler(key, [p.pid for p in procs])
        barrier.wait(timeout=120)
        meter = CpuMeter({"postgres": self.pg_pids, "redis": self.redis_pids})
        progress = Progress(key)
        arrivals = receiver.arrivals
        t0 = time.perf_counter()
        deadline = t0 + a.timeout
        while time.perf_counter() < deadline:
            running = sum(p.is_alive() for p in procs)
            elapsed = time.perf_counter() - t0
            unique = arrivals.unique
            progress.show(
                f"arrived {unique}/{a.n} (+{arrivals.repeats} duplicate)  "
                f"{unique / max(elapsed, 1e-9):,.0f}/s  {running} process(es) running  "
                f"{elapsed:.1f}s"
            )
            if not running:
                break
            if during is not None:
                during(unique)
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        _stop_multiprocessing(procs)
        cpu = meter.stop(
            elapsed, max(arrivals.unique, 1), extra={f"{key} processes": sum(loop_cpu[:])}
        )
        profiler.stop()
        failed = [p.exitcode for p in procs if p.exitcode]
        progress.done(
            f"{arrivals.unique}/{a.n} in {elapsed:.2f}s "
            f"({arrivals.unique / max(elapsed, 1e-9):,.0f}/s)"
        )
        with arrivals.lock:
            repeats = sum(n - 1 for n in arrivals.by_key.values())
            multi = sum(1 for keys in arrivals.occurrences.values() if len(keys) > 1)
            duplicated = sum(1 for n in arrivals.by_key.values() if n > 1)
        result = Result(
            key,
            name,
            a.n,
            arrivals.unique,
            elapsed,
            0.0,
            repeats,
            multi,
            notes=cpu,
            profile=profiler.summary(),
            cpu_ms=meter.per_item,
        )
        with psycopg.connect(conninfo) as conn:
            rows = conn.execute(f"SELECT count(*), count(DISTINCT key) FROM {table}").fetchone()
        result.notes.append(
            f"{duplicated} occurrences sent more than once; {table} holds "
            f"{rows[0]} rows for {rows[1]} keys"  # type: ignore[index]
        )
        if failed:
            result.notes.append(f"processes failed with exit codes {failed}")
        return result


def _poll(
    progress: Progress,
    count: Callable[[], int],
    n: int,
    timeout: float,
    text: Callable[[int, float, float], str],
    *,
    stop: Callable[[], bool] | None = None,
    t0: float | None = None,
) -> tuple[int, float]:
    """Poll `count()` until it reaches n (or `stop()` is true, or time is up); returns (count, s)."""
    t0 = time.perf_counter() if t0 is None else t0
    done = 0
    while True:
        done = count()
        elapsed = time.perf_counter() - t0
        progress.show(text(done, done / max(elapsed, 1e-9), elapsed))
        if done >= n or (stop is not None and stop()) or elapsed > timeout:
            break
        time.sleep(0.02)
    elapsed = time.perf_counter() - t0
    progress.done(f"{done}/{n} in {elapsed:.2f}s ({done / max(elapsed, 1e-9):,.0f}/s)")
    return done, elapsed


def _stop_multiprocessing(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    from clarion.ops.launch import wait_until

    if not wait_until(predicate, timeout, 0.05):
        raise RuntimeError(f"{what} did not finish within {timeout:.0f}s")


# --- report -----------------------------------------------------------------------------------


def report(rounds: list[list[Result]], args: argparse.Namespace, wall: float, load: str) -> None:
    import statistics

    width = 113
    say("\n" + "=" * width)
    say(
        f"clarion throughput   N={args.n}   workers={args.workers} x concurrency={args.concurrency} "
        f"({args.pool})   cpus={os.cpu_count()}   load average at start {load}"
    )
    say("-" * width)
    say(
        f"{'phase':<30}{'done':>11}{'elapsed':>9}{'publish':>9}{'items/s':>9}{'vs raw':>8}"
        f"{'CPU ms/item':>13}{'dup arrivals':>14}{'dup occ.':>10}"
    )
    ratios: dict[str, list[float]] = defaultdict(list)
    for number, results in enumerate(rounds, 1):
        by_key = {r.key: r for r in results}
        raw = by_key.get("raw")
        for r in results:
            ratio = r.rate / raw.rate if raw and raw.rate else None
            if ratio is not None:
                ratios[r.key].append(ratio)
            if (
                r.key in ("clarion", "naive", "seed")
                and (drain := by_key.get("drain"))
                and drain.rate
            ):
                ratios[f"{r.key}/consume"].append(r.rate / drain.rate)
            name = f"r{number} {r.name}" if len(rounds) > 1 else r.name
            dup = "-" if r.duplicates is None else str(r.duplicates)
            occ = "-" if r.duplicate_occurrences is None else str(r.duplicate_occurrences)
            cpu = "-" if r.cpu_ms is None else f"{r.cpu_ms:.2f}"
            publish = f"{r.publish_seconds:.2f}s" if r.publish_seconds else "-"
            say(
                f"{name:<30}{f'{r.completed}/{r.items}':>11}{r.elapsed:>8.2f}s{publish:>9}"
                f"{r.rate:>9,.0f}{'-' if ratio is None else f'{ratio:.2f}x':>8}{cpu:>13}{dup:>14}"
                f"{occ:>10}{'' if r.complete else '  INCOMPLETE'}"
            )
    say("-" * width)
    median = "median over rounds: " if len(rounds) > 1 else ""
    for key in ("clarion", "naive", "seed"):
        runs = [r for results in rounds for r in results if r.key == key]
        if not runs:
            continue
        line = f"{key}/raw_celery = "
        line += f"{median}{statistics.median(ratios[key]):.3f}" if ratios[key] else "-"
        if ratios[f"{key}/consume"]:
            line += (
                f"   ({key}/raw_consume_only = {statistics.median(ratios[f'{key}/consume']):.3f})"
            )
        dups = [r.duplicates for r in runs]
        occs = [r.duplicate_occurrences for r in runs]
        say(
            f"{line}   duplicates: {'/'.join(map(str, dups))} arrivals beyond the first per "
            f"idempotency key, {'/'.join(map(str, occs))} occurrences under >1 key"
        )
    say(
        "publish = time the producer took (inside elapsed); CPU ms/item = CPU of workers, "
        "PostgreSQL, Redis and this process\n(producer, receiver) per item; dup occ. = occurrences "
        "that arrived under more than one idempotency key"
    )
    for number, results in enumerate(rounds, 1):
        for r in results:
            if r.notes or r.profile:
                say(f"\n{f'r{number} ' if len(rounds) > 1 else ''}{r.name}:")
            for note in r.notes:
                say(f"  {note}")
            if r.profile:
                kind = {
                    "wall": "wall-clock samples, waiting included",
                    "cpu": "on-CPU samples only",
                    "gil": "samples of threads holding the GIL only: Python's own CPU",
                }[args.profile_mode]
                say(
                    f"  py-spy ({kind}; rates and CPU above are distorted by profiling, and "
                    "py-spy's own CPU shows as other processes):"
                )
                for line in r.profile:
                    say(f"    {line}")
    say(f"\nscript wall time {wall:.1f}s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--n", type=int, default=5000, help="notifications / tasks per phase (5000)"
    )
    parser.add_argument("--workers", type=int, default=2, help="celery worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool size per worker (2)")
    parser.add_argument("--pool", default="prefork", help="celery pool for both phases (prefork)")
    parser.add_argument(
        "--chunk", type=int, default=500, help="occurrences per notify_many call (500)"
    )
    parser.add_argument("--recipients", type=int, default=1000, help="distinct recipients (1000)")
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds allowed per phase (600)"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="seconds to wait after the last arrival before counting repeats (1)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat the phases this many times with fresh workers; ratios are "
        "medians over rounds (1)",
    )
    parser.add_argument(
        "--phases",
        default="raw,clarion,naive,seed",
        help="comma-separated subset of raw,clarion,naive,seed (all)",
    )
    parser.add_argument(
        "--seed-lag",
        type=int,
        default=0,
        help="seed phase: the second copy of an occurrence comes this many items after the "
        "first (0: at the same time, as in the naive phase; a redelivery after a visibility "
        "timeout comes later)",
    )
    parser.add_argument(
        "--event-endpoint",
        action="store_true",
        help="register an app endpoint for outbound events first, so every request and send "
        "writes its event in the outbox (the cost of issue 25's triggers on the sending path)",
    )
    parser.add_argument(
        "--purge",
        action="store_true",
        help="purge non-empty queues on a non-embedded broker instead of refusing",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record py-spy profiles of every process while each phase is timed, "
        "into DIR, and print where the time went (needs py-spy)",
    )
    parser.add_argument("--profile-rate", type=int, default=100, help="py-spy samples/s (100)")
    parser.add_argument(
        "--profile-mode",
        choices=("wall", "cpu", "gil"),
        default="wall",
        help="wall: every sample, waiting included (default); cpu: on-CPU samples only (py-spy "
        "may count a thread blocked in a socket call as running); gil: only threads holding the "
        "GIL (the Python CPU a process spends, without the kernel's share of its I/O)",
    )
    args = parser.parse_args(argv)
    if min(args.n, args.workers, args.concurrency, args.chunk, args.recipients, args.rounds) < 1:
        parser.error(
            "--n, --workers, --concurrency, --chunk, --recipients and --rounds must be positive"
        )
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := set(args.phases) - {"raw", "clarion", "naive", "seed"}:
        parser.error(f"unknown phase(s): {sorted(unknown)}")
    return args


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    started = time.perf_counter()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    cleanup = Cleanup()
    try:
        from clarion.settings import from_env
        from clarion.standins.receiver import Receiver

        bench = Bench(args, cleanup)
        bench.services()
        bench.database()
        bench.environment()
        say(f"logs: {bench.logs.relative_to(ROOT)}")
        secret = from_env().webhook_secret  # CLARION_WEBHOOK_SECRET (set by environment())
        rounds: list[list[Result]] = []
        for number in range(1, args.rounds + 1):
            bench.round, bench.tag = number, f"{bench.run_id}r{number}"
            if args.rounds > 1:
                say(f"\n--- round {number} of {args.rounds}")
            results: list[Result] = []
            if "raw" in args.phases:
                results += bench.raw_celery()
            if "clarion" in args.phases:
                with Receiver(secret) as receiver:
                    results.append(bench.clarion(receiver))
            if "naive" in args.phases:
                with Receiver(secret) as receiver:
                    results.append(bench.naive(receiver))
            if "seed" in args.phases:
                with Receiver(secret) as receiver:
                    results.append(bench.seed(receiver))
            rounds.append(results)
        cleanup.close()
        report(rounds, args, time.perf_counter() - started, load)
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything this run started", file=sys.stderr)
        return 130
    finally:
        cleanup.close()


if __name__ == "__main__":
    sys.exit(main())
