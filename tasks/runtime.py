"""Per-process resources for tasks: the catalog, adapters, Redis. Created lazily, once per process."""

from __future__ import annotations

import contextlib
import importlib
import os
import weakref
from collections.abc import Callable
from functools import update_wrapper
from pathlib import Path
from typing import Any, Generic, TypeVar

import redis as redis_lib

from clarion import clock, extras, settings
from clarion.adapters import webhook
from clarion.adapters.base import Adapter, Collaborators
from clarion.adapters.console import ConsoleAdapter
from clarion.adapters.inapp import InAppAdapter
from clarion.adapters.ratelimit import RateLimits
from clarion.adapters.webhook import WebhookAdapter
from clarion.catalog import Catalog
from clarion.catalog.model import EXAMPLES
from clarion.errors import ConfigurationError
from clarion.tasks import catalogs
from clarion.tasks.inbox import LedgerInbox

T = TypeVar("T")


class PerProcess(Generic[T]):
    """`factory()` cached for this process: a forked child (a prefork pool process) forgets what
    its parent built, through os.register_at_fork, so each call is one attribute read rather than
    a getpid() system call. cache_clear() forgets too."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._value: T | None = None
        self._built = False
        update_wrapper(self, factory)
        _CACHES.add(self)

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
        cached.cache_clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def per_process(factory: Callable[[], T]) -> PerProcess[T]:
    """Cache `factory()` per process id, so a forked child builds its own."""
    return PerProcess(factory)


@per_process
def loaded() -> catalogs.Loaded | catalogs.Fixed:
    """The catalog named by CLARION_CATALOG: a YAML file (reloaded when it changes:
    tasks/catalogs.py), or `package.module:NAME` holding a Catalog or the same mapping as the
    YAML. Unset: the built-in demo catalog, with a warning."""
    source = settings.get().catalog
    try:
        if source is None:
            return catalogs.Loaded(EXAMPLES / "demo.yaml", demo=True)
        if not Path(source).exists() and ":" in str(source):
            return catalogs.Fixed(_from_python(str(source)))
        return catalogs.Loaded(Path(source))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc


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
        from clarion.db import gating
        from clarion.db.engine import engine

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
        from clarion.db import gating
        from clarion.db.engine import engine

        with engine().begin() as conn:
            gating.forget_address(conn, user_id, channel=channel, value=value, now=clock.now())


class TeamsReferences:
    """Teams conversation references (db.teams) and gone bots (the suppression list)."""

    def __init__(self, suppressions: LedgerSuppressions) -> None:
        self.suppressions = suppressions

    def reference(self, user_id: str, teams_user: str) -> Any:
        from clarion.adapters.teams import ConversationRef
        from clarion.db import teams
        from clarion.db.engine import engine

        with engine().connect() as conn:
            return ConversationRef.from_json(
                teams.conversation_reference(conn, user_id, teams_user)
            )

    def gone(self, user_id: str, teams_user: str, detail: str) -> None:
        self.suppressions.suppress(user_id, "teams", teams_user, "deactivated", detail)


@per_process
def collaborators() -> Collaborators:
    """The composition root: what adapters get instead of importing db/ or tasks/."""
    suppressions = LedgerSuppressions()
    return Collaborators(
        redis=redis,
        limits=RateLimits(redis, wall=lambda: clock.now().timestamp()),
        suppressions=suppressions,
        extra={
            "teams_references": TeamsReferences(suppressions),
            "inbox": LedgerInbox(),
            "http": webhook.pool_manager(),  # one per process: kept-alive connections per host
        },
    )


@per_process
def adapters() -> dict[str, Adapter]:
    """Every channel configured on this worker, built with the shared collaborators."""
    s = settings.get()
    parts = collaborators()
    found: list[Adapter] = [
        ConsoleAdapter(),
        WebhookAdapter(
            secret=s.webhook_secret,
            timeout=s.webhook_timeout,
            default_url=s.webhook_url,
            limits=parts.limits,
            http=parts.extra["http"],
        ),
    ]
    found.append(InAppAdapter.from_collaborators(parts))  # needs nothing but the database
    if s.slack_token:
        extras.require("slack", "the slack channel (CLARION_SLACK_TOKEN is set)")
        from clarion.adapters.slack import SlackAdapter

        found.append(SlackAdapter.from_settings(s, parts))
    if s.teams_app_id:
        extras.require("teams", "the teams channel (CLARION_TEAMS_APP_ID is set)")
        from clarion.adapters.teams import TeamsAdapter

        found.append(TeamsAdapter.from_settings(s, parts))
    if s.fcm_service_account or s.apns_key:
        extras.require("push", "the push channel (an FCM or APNs key is set)")
        from clarion.adapters.push import PushAdapter

        found.append(PushAdapter.from_settings(s, parts))
    if s.sendgrid_api_key:  # SendGrid when its key is set, else the SMTP relay
        extras.require("sendgrid", "the email channel through SendGrid (CLARION_SENDGRID_API_KEY)")
        from clarion.adapters.sendgrid import SendGridAdapter

        found.append(SendGridAdapter.from_settings(s, parts))
    elif s.smtp_url:
        from clarion.adapters.smtp import SmtpAdapter

        found.append(SmtpAdapter.from_settings(s, parts))
    if s.twilio_account_sid:
        extras.require("twilio", "the sms channel (CLARION_TWILIO_ACCOUNT_SID is set)")
        from clarion.adapters.sms import SmsAdapter

        found.append(SmsAdapter.from_settings(s, parts))
    return {a.channel: a for a in found}


@per_process
def redis() -> redis_lib.Redis:
    return redis_lib.Redis.from_url(settings.get().urls()[1])


def count(name: str, amount: int = 1) -> None:
    """Bump a cluster-wide counter shown by `clarion stats` (best effort)."""
    if amount:
        with contextlib.suppress(redis_lib.RedisError):
            redis().hincrby("clarion:counters", name, amount)


def reset() -> None:
    """Forget cached resources (tests that switch catalogs or settings)."""
    for cached in (loaded, collaborators, adapters, redis):
        cached.cache_clear()
