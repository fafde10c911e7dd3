"""Lane budgets: how fast the activation lane may route and send, across every worker.

Lanes have their own queues and workers, so a nudge backlog never waits in front of a receipt; but
they share PostgreSQL, Redis and, on a small deployment, the hosts' CPUs. Routed and sent flat out,
a 100k-nudge backlog takes every spare cycle of the database, and receipts slow down with it.
`CLARION_ACTIVATION_PER_SECOND` caps the activation lane's routing, cluster-wide, and so the sends
that follow from it: the capacity it leaves is the transactional lane's headroom (bench/latency.py
measures the difference). Unset, the lane goes as fast as its workers do.

A budget is one Redis key per lane holding a GCRA "theoretical arrival time", advanced by one Lua
script on **Redis's clock**. The route task takes a budgeted lane's batch in slices of about SLICE
seconds of budget; after a slice commits, it reserves the requests it actually resolved (a
redelivered message whose requests are done costs nothing), waits the reservation out, and sends
the slice's deliveries itself (tasks.deliver.deliver_now): published instead, they would queue
behind the rest of the lane's route backlog. Across all workers the lane never runs ahead of its
rate by more than BURST seconds' worth. Nothing is locked while it waits; a process that dies
waiting or sending leaves committed deliveries to the tick and the claim leases, as any deliver
task does. Deliveries published later (held by a gate, retried, taken over) are not paced: they
were admitted already. Redis unreachable: the budget fails open — it protects our own capacity,
not a provider's quota (provider quotas are adapters/ratelimit.py, and fail closed).

**Bulk lanes can yield to transactional work** (CLARION_BULK_FEEDBACK=on; off by default until a
measurement shows a gain, bench/RESULTS.md): a cap is a rate
an operator must guess, and on a host where every process runs together no fixed rate is both
fast when receipts are idle and harmless when they are not (issue 28). A transactional route task
marks itself in flight in Redis for as long as it runs, up to ACTIVE_LEASE (2 s: a mark left by a
process killed mid-task stops counting then; `transactional_work`); a bulk lane's route
task (activation: nudges, broadcasts, digests) takes its batch in slices, and before each slice
its process's `Pacer` looks at that mark: while transactional work is in flight it waits (up to
`Feedback.patience`, 0.5 s), and its own rate follows an AIMD rule (`Feedback`): cut by half whenever it saw
transactional work, regained linearly while it sees none, so under a steady stream of receipts
the bulk slices that can still overlap one are a few rows, and with none the lane goes as fast as
its workers do. The state is per process (each bulk process reacts to the same mark; the bulk
path writes only a counter, `bulk_slices_gave_way` in `clarion stats`). Redis unreachable: the mark reads as idle (fails open, as above).
Bulk-only workers also run at a lower CPU priority (CLARION_BULK_NICE, tasks/app.py), so the
slice in progress when a receipt arrives gives way to it on the CPU; where Linux schedules each
session as one group (autogroup), a worker that leads its session nices the session too
(`nice_session`), or its niceness would count only against its own pool.

**Bulk lanes send one at a time beside transactional work** (on by default,
CLARION_BULK_SENDS_BESIDE=1; 0 turns it off): every transactional task sets `SEEN` for RECENT
seconds (one Redis SET; with the feedback on, in the same script as its in-flight mark), and a
bulk lane's send batch that finds it keeps at most that many sends in flight instead of
CLARION_SEND_CONCURRENCY (`sends_beside`). On a small host a receipt waits behind what the bulk
side does at the moment it arrives — eight sends in flight are eight replies the worker handles
and eight requests the provider's connections carry at once, a burst that fills every CPU —
not behind the bulk lane's average rate: capped at a quarter of its speed a campaign still
doubled the receipts' p95, sending one at a time it did not (bench/RESULTS.md, "Lanes under a
campaign"). With no transactional work for RECENT seconds the bulk lanes send as many as ever.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import kombu
import redis as redis_lib

from clarion import sentinel, settings
from clarion.names import LANES, QUEUES
from clarion.tasks import runtime

log = logging.getLogger(__name__)

SLICE = 0.1  # seconds of budget claimed and sent at a time
BURST = 0.1  # seconds of budget an idle lane may spend at once
KEY = "clarion:lane:{lane}:tat"

# KEYS[1]: the lane's theoretical arrival time (µs, Redis TIME). ARGV: rows, µs per row, burst µs.
# Returns µs to wait before the reserved rows may go (0: at once).
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
tat = tat + tonumber(ARGV[1]) * tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
local wait = tat - now - tonumber(ARGV[3])
if wait < 0 then wait = 0 end
return string.format('%.0f', wait)
"""


def rate(lane: str | None) -> float | None:
    """Sends per second the lane may make, or None: no budget."""
    return settings.get().activation_per_second if lane == "activation" else None


def reserve(lane: str, rows: int, per_second: float) -> float:
    """Reserve `rows` sends of the lane's budget; the seconds to wait before making them."""
    try:
        wait = runtime.redis().eval(
            _RESERVE,
            1,
            KEY.format(lane=lane),
            rows,
            f"{1_000_000 / per_second:.3f}",
            int(BURST * 1_000_000),
        )
    except redis_lib.RedisError:
        log.warning("lane budget unavailable", extra={"action": "lane_budget_open", "lane": lane})
        return 0.0
    return float(wait) / 1_000_000


def slices(lane: str | None, keys: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """A batch's keys in the slices it is routed in: about SLICE seconds of the lane's budget
    each, or the whole batch for a lane without one."""
    per_second = rate(lane)
    size = len(keys) if per_second is None else max(1, math.ceil(per_second * SLICE))
    return [keys[i : i + size] for i in range(0, len(keys), max(1, size))]


def wait_turn(lane: str | None, rows: int, *, sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until `rows` more requests of the lane may go on under its budget; returns the seconds
    waited (at most for the slices reserved before these, across all workers)."""
    per_second = rate(lane)
    if per_second is None or lane is None or rows <= 0:
        return 0.0
    wait = reserve(lane, rows, per_second)
    if wait > 0:
        sleep(wait)
    return wait


def queue_depths(broker_url: str) -> list[tuple[str, int, int | str]]:
    """(queue, messages waiting, consumers) for each clarion queue, on any kombu broker. Redis
    keeps no key for an empty queue and knows nothing of consumers, so there an absent queue is
    empty and consumers are not known ("?")."""
    rows: list[tuple[str, int, int | str]] = []
    options = sentinel.transport_options(broker_url, settings.get().sentinel_master)
    with kombu.Connection(broker_url, connect_timeout=5, transport_options=options) as conn:
        redis_broker = conn.transport.driver_type == "redis"
        channel = conn.channel()
        for queue in QUEUES:
            try:
                found = channel.queue_declare(queue=queue, passive=True)
                consumers: int | str = "?" if redis_broker else found.consumer_count
                rows.append((queue, found.message_count, consumers))
            except conn.channel_errors:  # Redis: empty; AMQP: no worker has declared it yet
                rows.append((queue, 0, "?" if redis_broker else 0))
                channel = conn.channel()
    return rows


# --- bulk lanes yield to transactional work -------------------------------------------------------

BULK = frozenset(LANES) - {"transactional"}  # lanes that give way to transactional work
ACTIVE = "clarion:lane:transactional:active"  # sorted set: in-flight task token -> expiry (ms)
# Seconds a mark counts at most. A mark is removed when its task ends; one whose process was
# SIGKILLed mid-task (a crash, a replaced worker, `clarion demo`'s crash after a send) stays until
# then, and while it counts every bulk slice waits out its patience and halves its rate: at 60 s
# that held the activation lane at about two rows a second for a minute after each crash (the
# demo's digest went unrouted). A receipt's route and send take tens of milliseconds; a task still
# running after ACTIVE_LEASE is waiting on a provider or a lock, not on the CPU or the database
# the bulk lanes would give back, so nothing is lost by no longer giving way to it.
ACTIVE_LEASE = 2.0

SEEN = "clarion:lane:transactional:seen"  # exists for RECENT seconds after a transactional task
# Seconds after a transactional task began during which bulk lanes keep fewer sends in flight
# (`sends_beside`): receipts one every two seconds or more often keep it set while they flow.
RECENT = 2.0

# KEYS[1]: the in-flight set, KEYS[2]: the seen flag. ARGV: token, lease ms, recent ms. Marks the
# token in flight until the lease ends, and transactional work seen for the next `recent` ms.
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('SET', KEYS[2], '1', 'PX', tonumber(ARGV[3]))
return 1
"""

# KEYS[1]: the in-flight set. Returns how many marks are live (expired ones are removed).
_ACTIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


def feedback_on() -> bool:
    """Whether bulk lanes yield to transactional work (CLARION_BULK_FEEDBACK, default off)."""
    return settings.get().bulk_feedback == "on"


@contextmanager
def transactional_work(lane: str | None) -> Iterator[None]:
    """A transactional task sets SEEN (bulk sends go one at a time for RECENT seconds:
    `sends_beside`) and, with the feedback on, marks itself in flight while it runs, for the bulk
    lanes' pacers to see; any other lane marks nothing. The mark counts for ACTIVE_LEASE at most:
    a process that dies leaves one that stops counting then."""
    if lane != "transactional":
        yield
        return
    client = runtime.redis()
    if not feedback_on():
        if settings.get().bulk_sends_beside > 0:
            with contextlib.suppress(redis_lib.RedisError):  # bulk lanes then send as many as ever
                client.set(SEEN, "1", px=int(RECENT * 1000))
        yield
        return
    token = uuid.uuid4().hex
    try:
        client.eval(_ENTER, 2, ACTIVE, SEEN, token, int(ACTIVE_LEASE * 1000), int(RECENT * 1000))
    except redis_lib.RedisError:
        token = ""
    try:
        yield
    finally:
        if token:
            with contextlib.suppress(redis_lib.RedisError):  # the mark expires by itself
                client.zrem(ACTIVE, token)


def transactional_active() -> int:
    """Transactional tasks in flight now, across every worker; 0 if Redis cannot be read."""
    try:
        return int(runtime.redis().eval(_ACTIVE, 1, ACTIVE))
    except redis_lib.RedisError:
        log.warning("lane feedback unavailable", extra={"action": "lane_feedback_open"})
        return 0


def sends_beside(lanes: Iterable[str | None], limit: int) -> int:
    """The sends a batch of rows of `lanes` may keep in flight, `limit` as configured: for a bulk
    lane's batch while transactional work was seen in the last RECENT seconds, at most
    CLARION_BULK_SENDS_BESIDE (default 1; 0: `limit`). Redis unreadable: `limit` (fails open)."""
    most = settings.get().bulk_sends_beside
    if most <= 0 or most >= limit or not any(lane in BULK for lane in lanes):
        return limit
    try:
        seen = bool(runtime.redis().exists(SEEN))
    except redis_lib.RedisError:
        return limit
    return most if seen else limit


@dataclass(frozen=True)
class Feedback:
    """The AIMD rule a bulk process paces itself by (rates in rows routed and sent per second).

    Seeing transactional work in flight multiplies the rate by `cut` (at most once per `react`
    seconds, so one receipt is one cut however many slices look at it), down to `floor`; every
    second with none seen adds `gain`, up to `ceiling`. A slice holds `slice` seconds of the
    rate (at least one row): under a steady stream of receipts the rate, and so the slice that
    can overlap the next receipt, stays small; with none it climbs to where the worker, not the
    rule, is the limit within about ceiling/gain seconds."""

    floor: float = 20.0
    ceiling: float = 20_000.0
    cut: float = 0.5
    gain: float = 4_000.0
    react: float = 0.05
    slice: float = 0.02
    patience: float = 0.5  # longest one slice waits for transactional work to finish
    poll: float = 0.005  # seconds between looks while it waits


@dataclass
class Budget:
    """One bulk process's feedback state: its rate, the tokens it holds, and when they were
    last counted (seconds on the process's monotonic clock)."""

    rate: float
    tokens: float
    at: float
    cut_at: float = -math.inf

    def observe(self, busy: bool, now: float, rule: Feedback) -> None:
        """Apply the rule for what was seen at `now`: tokens earned since `at` at the old rate,
        then the rate cut (busy) or grown (idle)."""
        elapsed = max(0.0, now - self.at)
        self.tokens = min(self.tokens + elapsed * self.rate, self.burst(rule))
        if busy:
            if now - self.cut_at >= rule.react:
                self.rate = max(rule.floor, self.rate * rule.cut)
                self.cut_at = now
        else:
            self.rate = min(rule.ceiling, self.rate + rule.gain * elapsed)
        self.tokens = min(self.tokens, self.burst(rule))
        self.at = now

    def burst(self, rule: Feedback) -> float:
        return max(1.0, self.rate * rule.slice)

    def size(self, rule: Feedback) -> int:
        """Rows the next slice holds: `slice` seconds of the rate."""
        return max(1, math.ceil(self.rate * rule.slice))

    def take(self, rows: int) -> float:
        """Spend `rows` tokens; the seconds to wait before the rows may go (0: at once)."""
        self.tokens -= rows
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class Pacer:
    """A bulk process's feedback budget (see the module docstring): `next_slice` waits its turn
    and says how many rows the next slice may hold. Clock, sleep and the transactional signal
    are parameters so the rule is tested without waiting."""

    def __init__(
        self,
        rule: Feedback | None = None,
        *,
        active: Callable[[], int] = transactional_active,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rule = rule or Feedback()
        self.active, self.clock, self.sleep = active, clock, sleep
        now = clock()
        self.budget = Budget(self.rule.ceiling, self.rule.ceiling * self.rule.slice, now)
        self.seen = False  # whether the last slice saw transactional work in flight

    def give_way(self) -> bool:
        """Wait while transactional work is in flight, up to `patience`; whether any was seen."""
        began = self.clock()
        seen = busy = self.active() > 0
        while busy and self.clock() - began < self.rule.patience:
            self.sleep(self.rule.poll)
            busy = self.active() > 0
        return seen

    def next_slice(self) -> int:
        """Give way to transactional work, apply the rule, wait for the slice's tokens; the rows
        the slice may hold."""
        seen = self.seen = self.give_way()
        self.budget.observe(seen, self.clock(), self.rule)
        rows = self.budget.size(self.rule)
        wait = self.budget.take(rows)
        if wait > 0:
            self.sleep(wait)
        return rows


_pacer: Pacer | None = None


def pacer() -> Pacer:
    """This process's pacer (a forked pool process starts from its parent's state: harmless)."""
    global _pacer
    if _pacer is None:
        _pacer = Pacer()
    return _pacer


def give_way(lane: str | None) -> None:
    """Wait while transactional work is in flight, if `lane` is a bulk lane and the feedback on:
    a broadcast's fan-out does this before each step (its chunks at once) it writes."""
    if lane in BULK and feedback_on():
        pacer().give_way()


def paced(lane: str | None, keys: list[tuple[str, int]]) -> Iterator[list[tuple[str, int]]]:
    """A route batch's keys in the slices it is routed in: a bulk lane with the feedback on takes
    them as its pacer allows, each slice sized when it is due; any other lane as `slices`."""
    if lane not in BULK or not feedback_on():
        yield from slices(lane, keys)
        return
    cap = rate(lane)
    most = len(keys) if cap is None else max(1, math.ceil(cap * SLICE))
    start = 0
    while start < len(keys):
        size = min(pacer().next_slice(), most)
        if pacer().seen:
            runtime.count("bulk_slices_gave_way")  # `clarion stats`: the feedback at work
        yield keys[start : start + size]
        start += size


# --- a bulk worker's niceness across sessions (autogroup) ---------------------------------------

AUTOGROUP = "/proc/self/autogroup"


def nice_session(step: int, path: str = AUTOGROUP) -> str | None:
    """Give this process's scheduling group the niceness `step` more, where Linux groups
    processes by session (autogroup: `/proc/sys/kernel/sched_autogroup_enabled`, on by default in
    most distributions' kernels). Under autogroup a process's own niceness weighs only against
    the other processes of its session: a bulk worker started in a session of its own (by
    systemd, a supervisor, ops/launch.py) competes with the transactional worker, PostgreSQL and
    Redis, each in theirs, as an equal, whatever `os.nice` it took. So a worker that leads its
    session (every process in it is its own or its pool's) sets the session's niceness as well;
    one that does not (started from a shell, whose session holds other programs) leaves the
    shell's session alone, and its niceness weighs against what was started beside it. In a
    cgroup of its own (a container, a systemd unit with CPU accounting) autogroup does not
    apply and this changes nothing: there the cgroup's CPU weight is what counts
    (docs/operations). None when done, else why not."""
    if step <= 0:
        return "no niceness asked"
    if os.getsid(0) != os.getpid():
        return "this process does not lead its session (its niceness applies within it)"
    return nice_group(step, path)


def nice_group(step: int, path: str) -> str | None:
    """Raise the niceness of the autogroup whose /proc file is `path` by `step` (at most to 19);
    None when done, else why not."""
    try:
        with open(path) as current:
            now = int(current.read().split()[-1])  # "/autogroup-120 nice 0"
        with open(path, "w") as group:
            group.write(str(min(19, now + step)))
    except (OSError, ValueError, IndexError) as exc:  # no autogroup in this kernel, no /proc
        return f"{type(exc).__name__}: {exc}"
    return None


# --- a bulk worker's PostgreSQL backends at its niceness -----------------------------------------

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def nice_backends(step: int) -> None:
    """Every database connection this process (and the pool processes it forks) opens from now on
    has its PostgreSQL backend reniced by `step`, and the backend's session (autogroup), where
    that is possible: a bulk worker's queries
    then give way to a receipt's on the CPU as its own code does (tasks/app.py). Only a server on
    this host (a Unix socket or loopback; not through a pooler, whose server connections are
    shared) whose backend process is a `postgres` this user may renice: the embedded default.
    Anywhere else nothing changes (said once, at INFO)."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    if step <= 0 or event.contains(Pool, "connect", _renice_backend):
        return
    global _backend_step
    _backend_step = step
    event.listen(Pool, "connect", _renice_backend)


_backend_step = 0
_backend_refused = False  # said why not once in this process


def _renice_backend(dbapi_connection: object, _record: object) -> None:
    global _backend_refused
    why = renice_backend(dbapi_connection, _backend_step)
    if why and not _backend_refused:
        _backend_refused = True
        log.info(
            "bulk worker's database backends not niced: %s",
            why,
            extra={"action": "bulk_backend_not_niced", "reason": why},
        )


def renice_backend(dbapi_connection: object, step: int) -> str | None:
    """Renice the backend serving `dbapi_connection` (psycopg) by `step` (at most to 19); None
    when done, else why not."""
    from clarion.db.engine import pooled_transactions

    if pooled_transactions():
        return "connections go through a pooler (CLARION_DATABASE_POOLER)"
    host = str(getattr(getattr(dbapi_connection, "info", None), "host", "") or "")
    if not (host.startswith("/") or host in LOCAL_HOSTS):
        return f"the server is not on this host ({host})"
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    try:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    finally:
        cursor.close()
    dbapi_connection.rollback()  # type: ignore[attr-defined]
    try:
        with open(f"/proc/{pid}/comm") as comm:
            if comm.read().strip() != "postgres":
                return f"process {pid} is not this server's backend (in a container?)"
        now = os.getpriority(os.PRIO_PROCESS, pid)
        os.setpriority(os.PRIO_PROCESS, pid, min(19, now + step))
    except OSError as exc:  # not permitted (another user's server), gone, or no /proc
        return f"{type(exc).__name__}: {exc}"
    # PostgreSQL starts every backend in a session of its own (InitPostmasterChild's setsid):
    # under autogroup each backend is a scheduling group of one, which its process niceness does
    # not reach (`nice_session`); the group's niceness does.
    group = f"/proc/{pid}/autogroup"
    if os.path.exists(group) and os.getsid(pid) == pid:
        return nice_group(step, group)
    return None
