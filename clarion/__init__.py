"""clarion: notifications and activation nudges that cannot double-send.

What app code calls, importable from here (each loaded on first use, so importing a submodule such as
`clarion.settings` never pulls in Celery or the database layer):

    from clarion import notify, notify_many, register_recipient, arm_series
    from clarion import subscribe, broadcast

The Celery app is `clarion.celery.app` (`celery -A clarion worker`); the HTTP API is
`clarion.web.router` (mount it in a host app) or `clarion web`.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("clarion")
except PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0+unknown"

# name -> module that defines it
_PUBLIC = {
    "Enqueued": "clarion.tasks.producer",
    "notify": "clarion.tasks.producer",
    "notify_many": "clarion.tasks.producer",
    "register_recipient": "clarion.tasks.producer",
    "preferences_link": "clarion.tasks.links",
    "arm_series": "clarion.tasks.arming",
    "broadcast": "clarion.tasks.broadcasts",
    "broadcast_progress": "clarion.tasks.broadcasts",
    "cancel_broadcast": "clarion.tasks.broadcasts",
    "dry_run_broadcast": "clarion.tasks.broadcasts",
    "subscribe": "clarion.tasks.audiences",
    "unsubscribe": "clarion.tasks.audiences",
    "cancel_series": "clarion.tasks.series",
    "pause_series": "clarion.tasks.series",
    "resume_series": "clarion.tasks.series",
    "snooze_occurrence": "clarion.tasks.series",
    "get_preferences": "clarion.tasks.preferences",
    "set_preferences": "clarion.tasks.preferences",
    "feed": "clarion.tasks.inbox",
    "mark": "clarion.tasks.inbox",
    "mark_all_read": "clarion.tasks.inbox",
    "unread_count": "clarion.tasks.inbox",
    "inbox_token": "clarion.tasks.inbox",
    "ClarionError": "clarion.errors",
    "ConfigurationError": "clarion.errors",
    "InvalidRequest": "clarion.errors",
    "InvalidField": "clarion.errors",
    "UnknownType": "clarion.errors",
    "UnknownRecipient": "clarion.errors",
    "MissingVariables": "clarion.errors",
}
__all__ = [
    "__version__",
    "Enqueued",
    "notify",
    "notify_many",
    "register_recipient",
    "preferences_link",
    "arm_series",
    "broadcast",
    "broadcast_progress",
    "cancel_broadcast",
    "dry_run_broadcast",
    "subscribe",
    "unsubscribe",
    "cancel_series",
    "pause_series",
    "resume_series",
    "snooze_occurrence",
    "get_preferences",
    "set_preferences",
    "feed",
    "mark",
    "mark_all_read",
    "unread_count",
    "inbox_token",
    "ClarionError",
    "ConfigurationError",
    "InvalidRequest",
    "InvalidField",
    "UnknownType",
    "UnknownRecipient",
    "MissingVariables",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'clarion' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from clarion.errors import (
        ClarionError,
        ConfigurationError,
        InvalidField,
        InvalidRequest,
        MissingVariables,
        UnknownRecipient,
        UnknownType,
    )
    from clarion.tasks.arming import arm_series
    from clarion.tasks.audiences import subscribe, unsubscribe
    from clarion.tasks.broadcasts import (
        broadcast,
        broadcast_progress,
        cancel_broadcast,
        dry_run_broadcast,
    )
    from clarion.tasks.inbox import feed, inbox_token, mark, mark_all_read, unread_count
    from clarion.tasks.links import preferences_link
    from clarion.tasks.preferences import get_preferences, set_preferences
    from clarion.tasks.producer import Enqueued, notify, notify_many, register_recipient
    from clarion.tasks.series import (
        cancel_series,
        pause_series,
        resume_series,
        snooze_occurrence,
    )
