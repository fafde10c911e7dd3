"""Every channel clarion can send on: its name, the setting that turns it on, and its factory.

A channel is one module with a class on the `Channel` template (adapters/base.py) whose
`from_settings(settings, collaborators)` builds it; adding one is that module and one line here.
A factory is named by "module:Class" and imported only when its channel is turned on, so a
channel whose SDK comes with a pip extra (slack, teams, push, sendgrid, twilio) costs nothing,
and needs nothing installed, where it is off. The composition root (tasks.runtime) builds the
turned-on ones with the process's collaborators.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from clarion import extras
from clarion.adapters.base import Adapter, Collaborators
from clarion.settings import Settings


@dataclass(frozen=True)
class Registered:
    """One way to send on a channel (email has two: SendGrid when its key is set, else SMTP)."""

    name: str
    enabled: Callable[[Settings], bool]  # the setting that turns it on
    factory: str  # "module:Class", whose from_settings(settings, collaborators) builds it
    extra: str | None = None  # the pip extra its SDK comes with
    needs: str = ""  # what a missing extra is needed for, as extras.require says it

    def build(self, s: Settings, parts: Collaborators) -> Adapter:
        if self.extra is not None:
            extras.require(self.extra, self.needs)
        module, _, name = self.factory.partition(":")
        built: Adapter = getattr(importlib.import_module(module), name).from_settings(s, parts)
        return built


def _always(s: Settings) -> bool:
    return True


CHANNELS: tuple[Registered, ...] = (
    Registered("console", _always, "clarion.adapters.console:ConsoleAdapter"),
    Registered("webhook", _always, "clarion.adapters.webhook:WebhookAdapter"),
    Registered("in_app", _always, "clarion.adapters.inapp:InAppAdapter"),  # clarion's database
    Registered(
        "slack",
        lambda s: bool(s.slack_token),
        "clarion.adapters.slack:SlackAdapter",
        "slack",
        "the slack channel (CLARION_SLACK_TOKEN is set)",
    ),
    Registered(
        "teams",
        lambda s: bool(s.teams_app_id),
        "clarion.adapters.teams:TeamsAdapter",
        "teams",
        "the teams channel (CLARION_TEAMS_APP_ID is set)",
    ),
    Registered(
        "push",
        lambda s: bool(s.fcm_service_account or s.apns_key),
        "clarion.adapters.push:PushAdapter",
        "push",
        "the push channel (an FCM or APNs key is set)",
    ),
    Registered(
        "sendgrid",
        lambda s: bool(s.sendgrid_api_key),
        "clarion.adapters.sendgrid:SendGridAdapter",
        "sendgrid",
        "the email channel through SendGrid (CLARION_SENDGRID_API_KEY)",
    ),
    Registered(  # the email channel through an SMTP relay, unless SendGrid's key is set
        "smtp",
        lambda s: bool(s.smtp_url) and not s.sendgrid_api_key,
        "clarion.adapters.smtp:SmtpAdapter",
    ),
    Registered(
        "sms",
        lambda s: bool(s.twilio_account_sid),
        "clarion.adapters.sms:SmsAdapter",
        "twilio",
        "the sms channel (CLARION_TWILIO_ACCOUNT_SID is set)",
    ),
)


def build(s: Settings, parts: Collaborators) -> dict[str, Adapter]:
    """channel -> adapter, for every registered channel `s` turns on."""
    return {a.channel: a for a in (r.build(s, parts) for r in CHANNELS if r.enabled(s))}
