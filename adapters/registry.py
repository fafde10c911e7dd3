"""Every channel clarion can send on: its name, the setting that turns it on, and its factory.

A channel is one module with a class on the `Channel` template (adapters/base.py) whose
`from_settings(settings, collaborators)` builds it; adding one is that module and one line here.
A factory is named by "module:Class" and imported only when its channel is turned on, so a
channel whose SDK comes with a pip extra (slack, teams, push, sendgrid, twilio) costs nothing,
and needs nothing installed, where it is off. The composition root (tasks.runtime) builds the
turned-on ones with the process's collaborators.

A channel with more than one provider turned on (CLARION_EMAIL_PROVIDERS: sendgrid,
sendgrid_backup, smtp; CLARION_SMS_PROVIDERS: twilio, twilio_backup) is built as one
adapters.failover.FailoverAdapter over them, in the order the setting names them. A backup is the
same adapter built from the settings with its own credentials in place of the primary's (`view`),
so it keeps its own rate budget (keyed by its own API key or number).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from clarion import extras
from clarion.adapters.base import Adapter, Collaborators
from clarion.adapters.failover import FailoverAdapter, Provider
from clarion.errors import ConfigurationError
from clarion.settings import Settings


@dataclass(frozen=True)
class Registered:
    """One way to send on a channel (email has two: SendGrid when its key is set, else SMTP)."""

    name: str
    enabled: Callable[[Settings], bool]  # the setting that turns it on
    factory: str  # "module:Class", whose from_settings(settings, collaborators) builds it
    extra: str | None = None  # the pip extra its SDK comes with
    needs: str = ""  # what a missing extra is needed for, as extras.require says it
    view: Callable[[Settings], Settings] | None = None  # a backup: its credentials in place
    requires: tuple[str, ...] = ()  # settings it cannot be built without

    def build(self, s: Settings, parts: Collaborators) -> Adapter:
        missing = [f"CLARION_{n.upper()}" for n in self.requires if not getattr(s, n)]
        if missing:
            raise ConfigurationError(f"the {self.name} provider needs {', '.join(missing)}")
        if self.extra is not None:
            extras.require(self.extra, self.needs)
        module, _, name = self.factory.partition(":")
        view = self.view(s) if self.view is not None else s
        built: Adapter = getattr(importlib.import_module(module), name).from_settings(view, parts)
        return built


def _always(s: Settings) -> bool:
    return True


def _listed(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(","))


def email_providers(s: Settings) -> tuple[str, ...]:
    """The email providers turned on, in order of preference (CLARION_EMAIL_PROVIDERS)."""
    if s.email_providers:
        return _listed(s.email_providers)
    if s.sendgrid_api_key:
        return ("sendgrid", "sendgrid_backup") if s.sendgrid_backup_api_key else ("sendgrid",)
    return ("smtp",) if s.smtp_url else ()


def sms_providers(s: Settings) -> tuple[str, ...]:
    """The sms providers turned on, in order of preference (CLARION_SMS_PROVIDERS)."""
    if s.sms_providers:
        return _listed(s.sms_providers)
    if s.twilio_account_sid:
        return ("twilio", "twilio_backup") if s.twilio_backup_account_sid else ("twilio",)
    return ()


def _sendgrid_backup(s: Settings) -> Settings:
    return dataclasses.replace(
        s,
        sendgrid_api_key=s.sendgrid_backup_api_key,
        sendgrid_api_url=s.sendgrid_backup_api_url,
        sendgrid_webhook_public_key=s.sendgrid_backup_webhook_public_key,
    )


def _twilio_backup(s: Settings) -> Settings:
    return dataclasses.replace(
        s,
        twilio_account_sid=s.twilio_backup_account_sid,
        twilio_auth_token=s.twilio_backup_auth_token,
        twilio_api_url=s.twilio_backup_api_url,
        twilio_from=s.twilio_backup_from,
    )


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
        lambda s: "sendgrid" in email_providers(s),
        "clarion.adapters.sendgrid:SendGridAdapter",
        "sendgrid",
        "the email channel through SendGrid (CLARION_SENDGRID_API_KEY)",
        requires=("sendgrid_api_key",),
    ),
    Registered(
        "sendgrid_backup",
        lambda s: "sendgrid_backup" in email_providers(s),
        "clarion.adapters.sendgrid:SendGridAdapter",
        "sendgrid",
        "the email channel through SendGrid (CLARION_SENDGRID_BACKUP_API_KEY)",
        view=_sendgrid_backup,
        requires=("sendgrid_backup_api_key",),
    ),
    Registered(  # the email channel through an SMTP relay
        "smtp",
        lambda s: "smtp" in email_providers(s),
        "clarion.adapters.smtp:SmtpAdapter",
        requires=("smtp_url",),
    ),
    Registered(
        "twilio",
        lambda s: "twilio" in sms_providers(s),
        "clarion.adapters.sms:SmsAdapter",
        "twilio",
        "the sms channel (CLARION_TWILIO_ACCOUNT_SID is set)",
        requires=("twilio_account_sid",),
    ),
    Registered(
        "twilio_backup",
        lambda s: "twilio_backup" in sms_providers(s),
        "clarion.adapters.sms:SmsAdapter",
        "twilio",
        "the sms channel's second account (CLARION_TWILIO_BACKUP_ACCOUNT_SID is set)",
        view=_twilio_backup,
        requires=(
            "twilio_backup_account_sid",
            "twilio_backup_auth_token",
            "twilio_backup_from",
        ),
    ),
)
PREFERENCE: dict[str, Callable[[Settings], tuple[str, ...]]] = {
    "email": email_providers,
    "sms": sms_providers,
}


def build(s: Settings, parts: Collaborators) -> dict[str, Adapter]:
    """channel -> adapter, for every registered channel `s` turns on; a channel with more than
    one provider turned on gets a FailoverAdapter over them, in order of preference."""
    found: dict[str, list[Provider]] = {}
    for r in CHANNELS:
        if r.enabled(s):
            adapter = r.build(s, parts)
            found.setdefault(adapter.channel, []).append(Provider(r.name, adapter))
    built: dict[str, Adapter] = {}
    for channel, providers in found.items():
        if len(providers) == 1:
            built[channel] = providers[0].adapter
            continue
        order = PREFERENCE[channel](s)
        providers.sort(key=lambda p: order.index(p.name))
        built[channel] = FailoverAdapter(channel, providers, parts.circuits, parts.alerts)
    return built
