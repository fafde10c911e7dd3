"""The composition root: per-process resources for tasks (the catalog, adapters and what they are
handed, Redis), created lazily, once per process."""

from __future__ import annotations

import contextlib
import importlib
import os
import weakref
from collections.abc import Callable
from functools import update_wrapper
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import redis as redis_lib

from clarion import clock, extras, sentinel, settings
from clarion.adapters import registry, webhook
from clarion.adapters.base import Adapter, Collaborators
from clarion.adapters.circuit import Circuits, Policy, RedisBackend
from clarion.adapters.ratelimit import RateLimits
from clarion.catalog import Catalog
from clarion.catalog.model import EXAMPLES
from clarion.db import alerts, gating, teams
from clarion.db.engine import engine
from clarion.errors import ClarionError, ConfigurationError
from clarion.tasks import catalogs
from clarion.tasks.inbox import LedgerInbox

if TYPE_CHECKING:
    from clarion.adapters.teams import ConversationRef

T = TypeVar("T")


class PerProcess(Generic[T]):
    """`factory()` cached for this process: a forked child (a prefork pool process) forgets what
    its parent built, through os.register_at_fork, so each call is one attribute read rather than
    a getpid() system call. cache_clear() forgets too. With `inherit`, a child keeps its parent's
    value instead and `inherit(value)` makes it its own (renews its locks)."""

    def __init__(
        self, factory: Callable[[], T], inherit: Callable[[T], None] | None = None
    ) -> None:
        self._factory = factory
        self._inherit = inherit
        self._value: T | None = None
        self._built = False
        update_wrapper(self, factory)
        _CACHES.add(self)

    def forked(self) -> None:
        """In a forked child: forget, or keep and adopt when the value may be inherited."""
        if self._inherit is not None and self._built:
            self._inherit(self._value)  # type: ignore[arg-type]
        else:
            self.cache_clear()

    def __call__(self) -> T:
        if not self._built:
            self._value = self._factory()
            self._built = True
        return self._value  # type: ignore[return-value]

    def cache_clear(self) -> None:
        self._built = False
        self._value = None


_CACHES: weakref.WeakSet[PerProcess] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for cached in list(_CACHES):
        cached.forked()


os.register_at_fork(after_in_child=_forget_after_fork)


def per_process(factory: Callable[[], T]) -> PerProcess[T]:
    """Cache `factory()` per process id, so a forked child builds its own."""
    return PerProcess(factory)


def _loaded() -> catalogs.Loaded | catalogs.Fixed:
    """The catalog named by CLARION_CATALOG: a YAML file (reloaded when it changes:
    tasks/catalogs.py), or `package.module:NAME` holding a Catalog or the same mapping as the
    YAML. Unset: the built-in demo catalog, with a warning. A pool process inherits the one its
    worker checked at start."""
    source = settings.get().catalog
    try:
        if source is None:
            return catalogs.Loaded(EXAMPLES / "demo.yaml", demo=True)
        if not Path(source).exists() and ":" in str(source):
            return catalogs.Fixed(_from_python(str(source)))
        return catalogs.Loaded(Path(source))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc


loaded = PerProcess(_loaded, inherit=lambda source: source.after_fork())


def watch_catalog() -> None:
    """This process looks at its catalog file every second even when no task asks (a pool
    process, or a solo/threads worker); nothing for a catalog built in Python."""
    with contextlib.suppress(ClarionError):  # never loaded: the first task says so
        loaded().watch()


def catalog() -> Catalog:
    """The running catalog (looks at its file at most once a second: tasks/catalogs.py)."""
    return loaded().current()


def catalog_now() -> Catalog:
    """The catalog after looking at its file now: for a type or version this process lacks."""
    return loaded().check_now()


def check_catalog() -> Catalog:
    """Load the configured catalog afresh and check it as a worker must before it starts: every
    channel a known one, every template version rendered for every channel it targets with its
    sample variables. Raises ConfigurationError naming file, type, version and field."""
    loaded.cache_clear()
    running = catalog()
    try:
        checked = running.check()
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    check_extras(checked)
    return checked


def check_extras(loaded: Catalog) -> None:
    """ConfigurationError naming the pip extra when the catalog uses a channel (or the digest
    summariser) whose SDK this install lacks: "the sms channel needs `pip install 'clarion[twilio]'`"."""
    used = {channel for ntype in loaded.types.values() for channel in ntype.channels}
    extras.require_channels(used, sendgrid=bool(settings.get().sendgrid_api_key))
    for ntype in loaded.types.values():
        spec = ntype.digest
        if spec is not None and spec.summariser == "anthropic":
            extras.require("ai", f"{ntype.key}'s digest summariser anthropic")


def _from_python(spec: str) -> Catalog:
    module_name, _, name = spec.partition(":")
    try:
        value = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"CLARION_CATALOG={spec!r}: cannot import {name} from {module_name}"
        ) from exc
    if isinstance(value, Catalog):
        return value.check()
    if isinstance(value, dict):
        return Catalog.from_dict(value, spec)
    raise ConfigurationError(f"CLARION_CATALOG={spec!r} is neither a Catalog nor a mapping")


class LedgerSuppressions:
    """The suppression list and recipients' addresses in clarion's database (db.gating)."""

    def suppress(self, user_id: str, channel: str, address: str, reason: str, detail: str) -> None:
        with engine().begin() as conn:
            gating.suppress_address(
                conn,
                user_id,
                channel=channel,
                address=address,
                reason=reason,
                detail=detail[:500],
                now=clock.now(),
            )

    def forget_address(self, user_id: str, channel: str, value: str) -> None:
        with engine().begin() as conn:
            gating.forget_address(conn, user_id, channel=channel, value=value, now=clock.now())


class TeamsReferences:
    """Teams conversation references (db.teams) and gone bots (the suppression list)."""

    def __init__(self, suppressions: LedgerSuppressions) -> None:
        self.suppressions = suppressions

    def reference(self, user_id: str, teams_user: str) -> ConversationRef | None:
        from clarion.adapters.teams import ConversationRef  # botbuilder: only where Teams is on

        with engine().connect() as conn:
            return ConversationRef.from_json(
                teams.conversation_reference(conn, user_id, teams_user)
            )

    def gone(self, user_id: str, teams_user: str, detail: str) -> None:
        self.suppressions.suppress(user_id, "teams", teams_user, "deactivated", detail)


class LedgerProviderAlerts:
    """A provider failover as an open `provider_failover` alert (db.alerts; one per provider),
    cleared when the provider takes a message again."""

    KIND = "provider_failover"

    def failed_over(self, channel: str, provider: str, detail: str) -> None:
        with engine().begin() as conn:
            alerts.open_alert(
                conn, self.KIND, f"{channel}:{provider}", value=1.0, detail=detail, now=clock.now()
            )

    def recovered(self, channel: str, provider: str) -> None:
        with engine().begin() as conn:
            alerts.clear_alert(conn, self.KIND, f"{channel}:{provider}", now=clock.now())


@per_process
def collaborators() -> Collaborators:
    """The composition root: what adapters get instead of importing db/ or tasks/."""
    suppressions = LedgerSuppressions()
    s = settings.get()
    policy = Policy(s.circuit_failures, s.circuit_open_seconds, s.circuit_probe_seconds)
    return Collaborators(
        redis=redis,
        limits=RateLimits(redis, wall=lambda: clock.now().timestamp()),
        suppressions=suppressions,
        references=TeamsReferences(suppressions),
        inbox=LedgerInbox(),
        http=webhook.pool_manager(),  # one per process: kept-alive connections per host
        circuits=Circuits(RedisBackend(redis), policy),
        alerts=LedgerProviderAlerts(),
    )


@per_process
def adapters() -> dict[str, Adapter]:
    """Every channel this worker's settings turn on (adapters/registry.py), built with the
    shared collaborators."""
    return registry.build(settings.get(), collaborators())


@per_process
def redis() -> redis_lib.Redis:
    s = settings.get()
    return sentinel.client(s.urls()[1], s.sentinel_master)  # follows a Sentinel failover


def count(name: str, amount: int = 1) -> None:
    """Bump a cluster-wide counter shown by `clarion stats` (best effort)."""
    if amount:
        with contextlib.suppress(redis_lib.RedisError):
            redis().hincrby("clarion:counters", name, amount)


def reset() -> None:
    """Forget cached resources (tests that switch catalogs or settings)."""
    for cached in (loaded, collaborators, adapters, redis):
        cached.cache_clear()
