"""A health state per provider, shared by every worker: a circuit breaker.

The policy is data plus two pure functions over a `Circuit` and the time (habit 9), apart from
where the state is kept (habit 16: a Redis backend for the fleet, an in-memory one for unit tests):

    closed ──(`failures` confirmed failures, timeouts or 5xx in a row)──► open
    open ──(`open_for` seconds later, one caller is admitted: the probe)──► half_open
    half_open ──(the probe succeeds)──► closed      half_open ──(it fails)──► open (timer anew)
    half_open ──(the probe reports nothing for `probe_for` seconds)──► a new probe is admitted

A success in `closed` resets the count. A success reported while `open` (a send that began
before the circuit opened) changes nothing: only a probe closes an open circuit.

Time is the store's, never a worker's: the Redis backend reads Redis's `TIME` in the same round
trip as the state, so workers whose clocks disagree still agree on when a circuit half-opens.
Each transition is a WATCH/MULTI transaction on one hash, so two workers cannot both take the
probe. Redis unreachable: every provider counts as closed (clarion tries them in order, as it
would without failover) and nothing is recorded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, cast

import redis as redis_lib

log = logging.getLogger(__name__)
PREFIX = "clarion:circuit"  # Redis: one hash per provider, {PREFIX}:{channel}:{provider}
KEEP = 86400  # seconds an untouched circuit is kept; a forgotten one is closed, which is safe


class State(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


GAUGE = {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}  # clarion_provider_circuit_state


@dataclass(frozen=True)
class Circuit:
    """One provider's health: its state, consecutive failures, and when it last opened or its
    probe began (seconds on the store's clock)."""

    state: State = State.CLOSED
    failures: int = 0
    since: float = 0.0


@dataclass(frozen=True)
class Policy:
    failures: int = 5  # confirmed failures, timeouts or 5xx in a row that open the circuit
    open_for: float = 30.0  # seconds an open circuit turns callers away before a probe
    probe_for: float = 30.0  # seconds a probe may go unreported before another is admitted

    def __post_init__(self) -> None:
        if self.failures < 1 or self.open_for <= 0 or self.probe_for <= 0:
            raise ValueError(f"circuit policy must be positive, not {self}")


def admit(circuit: Circuit, now: float, policy: Policy) -> tuple[bool, Circuit]:
    """Whether a send may go to this provider now, and the circuit after admitting it."""
    if circuit.state is State.CLOSED:
        return True, circuit
    wait = policy.open_for if circuit.state is State.OPEN else policy.probe_for
    if now >= circuit.since + wait:  # the probe: one caller, until it reports or goes silent
        return True, Circuit(State.HALF_OPEN, circuit.failures, now)
    return False, circuit


def record(circuit: Circuit, ok: bool, now: float, policy: Policy) -> Circuit:
    """The circuit after a send to this provider succeeded (`ok`) or failed."""
    if ok:
        return circuit if circuit.state is State.OPEN else Circuit()
    failures = circuit.failures + 1
    if circuit.state is State.HALF_OPEN or (
        circuit.state is State.CLOSED and failures >= policy.failures
    ):
        return Circuit(State.OPEN, failures, now)
    return Circuit(circuit.state, failures, circuit.since)


def reopens_in(circuit: Circuit, now: float, policy: Policy) -> float:
    """Seconds until a caller is admitted (0 when one would be now)."""
    if circuit.state is State.CLOSED:
        return 0.0
    wait = policy.open_for if circuit.state is State.OPEN else policy.probe_for
    return max(0.0, circuit.since + wait - now)


@dataclass(frozen=True)
class Change:
    """What one step did: its answer (admitted or not), the circuit before and after, and the
    store's time."""

    admitted: bool
    before: Circuit
    after: Circuit
    now: float

    @property
    def changed(self) -> bool:
        return self.before != self.after


Step = Callable[[Circuit, float], tuple[bool, Circuit]]


class Backend(Protocol):
    def apply(self, name: str, step: Step) -> Change:
        """Run `step` on the named circuit at the store's time, atomically."""
        ...


class Circuits:
    """The policy over a backend: `admit(name)`, `record(name, ok)`, `read(name)`."""

    def __init__(self, backend: Backend, policy: Policy) -> None:
        self.backend = backend
        self.policy = policy

    def admit(self, name: str) -> Change:
        return self.backend.apply(name, lambda c, now: admit(c, now, self.policy))

    def record(self, name: str, ok: bool) -> Change:
        return self.backend.apply(name, lambda c, now: (ok, record(c, ok, now, self.policy)))

    def read(self, name: str) -> Change:
        return self.backend.apply(name, lambda c, now: (True, c))


class MemoryBackend:
    """Circuits in this process, on an injected clock (unit tests)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.circuits: dict[str, Circuit] = {}
        self.lock = threading.Lock()

    def apply(self, name: str, step: Step) -> Change:
        with self.lock:
            before, now = self.circuits.get(name, Circuit()), self.now()
            answer, after = step(before, now)
            self.circuits[name] = after
            return Change(answer, before, after, now)


def _parse(raw: dict[bytes, bytes]) -> Circuit:
    if not raw:
        return Circuit()
    try:
        return Circuit(State(raw[b"state"].decode()), int(raw[b"failures"]), float(raw[b"since"]))
    except (KeyError, ValueError):  # not ours, or half-written by hand: start closed
        return Circuit()


def _seconds(time_reply: tuple[int, int]) -> float:
    return time_reply[0] + time_reply[1] / 1_000_000


class RedisBackend:
    """Circuits in Redis, on Redis's clock (see the module docstring)."""

    def __init__(self, redis: Callable[[], redis_lib.Redis], prefix: str = PREFIX) -> None:
        self.redis = redis
        self.prefix = prefix

    def apply(self, name: str, step: Step) -> Change:
        key = f"{self.prefix}:{name}"
        try:
            client = self.redis()
            # One round trip when nothing changes (the usual case: a closed circuit admits).
            pipe = client.pipeline(transaction=False)
            pipe.hgetall(key)
            pipe.time()
            raw, now = cast(tuple[dict[bytes, bytes], tuple[int, int]], pipe.execute())
            before = _parse(raw)
            answer, after = step(before, _seconds(now))
            if after == before:
                return Change(answer, before, after, _seconds(now))
            return self._transition(client, key, step)
        except redis_lib.RedisError:
            log.warning("circuit unreadable", exc_info=True, extra={"action": "circuit_unread"})
            return Change(True, Circuit(), Circuit(), 0.0)

    def _transition(self, client: redis_lib.Redis, key: str, step: Step) -> Change:
        with client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    before = _parse(cast(dict[bytes, bytes], pipe.hgetall(key)))
                    now = _seconds(pipe.time())
                    answer, after = step(before, now)
                    pipe.multi()
                    pipe.hset(
                        key,
                        mapping={
                            "state": str(after.state),
                            "failures": after.failures,
                            "since": repr(after.since),
                        },
                    )
                    pipe.expire(key, KEEP)
                    pipe.execute()
                    return Change(answer, before, after, now)
                except redis_lib.WatchError:
                    continue  # another worker moved it first: judge again from its state
