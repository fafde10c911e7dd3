"""A starting worker waits for its broker and database instead of refusing: they may simply not
be up yet (a host booting, a broker restarting). Wrong configuration is not waited for; that is
tasks/app.py's refusal (exit 2).

    wait_for(probes(broker_url), within=settings.get().start_wait)

Each attempt asks every probe once; while one fails it prints one line on stderr (the attempt,
what is missing, the next delay) and sleeps, the delay doubling from `first` up to `most`. Past
`within` seconds it raises DependencyMissing, which the worker turns into exit status 75
(UNAVAILABLE): its supervisor starts it again later (ops/launch.py), so the wait never ends in a
final refusal. Sleep and clock are parameters so the policy is tested without waiting.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from clarion.errors import DependencyMissing

UNAVAILABLE = 75  # EX_TEMPFAIL: a dependency is not there yet; starting again later may work
PROBE_TIMEOUT = 3.0  # seconds one probe may take

Probe = Callable[[], str | None]  # None: there; else why not


@dataclass(frozen=True)
class Waiting:
    """Delays between attempts: first, doubled after each failed attempt, at most `most`."""

    first: float = 0.5
    most: float = 10.0

    def delay(self, attempt: int) -> float:
        """The pause after failed attempt number `attempt` (1, 2, ...)."""
        return min(self.most, self.first * 2 ** min(attempt - 1, 30))


def wait_for(
    probes: Mapping[str, Probe],
    *,
    within: float,
    waiting: Waiting = Waiting(),
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] | None = None,
) -> int:
    """Return the number of attempts once every probe answers None; raise DependencyMissing if
    some still fail after `within` seconds (at least one attempt is always made)."""
    say = say or _stderr
    began, attempt = monotonic(), 0
    while True:
        attempt += 1
        missing = {name: why for name, probe in probes.items() if (why := probe()) is not None}
        if not missing:
            if attempt > 1:
                say(f"clarion: worker ready after {attempt} attempts")
            return attempt
        pause = waiting.delay(attempt)
        if monotonic() - began + pause > within:
            raise DependencyMissing(missing)
        shown = "; ".join(f"{name}: {why}" for name, why in missing.items())
        say(f"clarion: worker not ready (attempt {attempt}): {shown}; next attempt in {pause:g} s")
        sleep(pause)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def broker_probe(connect: Callable[[], None]) -> Probe:
    """A probe that calls `connect` (one short connection attempt) and reports its error."""

    def probe() -> str | None:
        try:
            connect()
        except Exception as exc:  # any failure to connect is "not there yet"
            return _short(exc)
        return None

    return probe


def database_probe(url: str) -> Probe:
    """A probe that opens one connection to `url` (no pool, short timeout)."""

    def probe() -> str | None:
        import psycopg

        from clarion.db.engine import driver_args

        try:
            with psycopg.connect(**driver_args(url) | {"connect_timeout": int(PROBE_TIMEOUT)}):
                return None
        except psycopg.OperationalError as exc:
            return _short(exc)

    return probe


def _short(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:200]
