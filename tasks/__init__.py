"""Celery tasks and the producer API.

from clarion.tasks import notify, register_recipient, preferences_link
"""

from clarion.tasks.links import preferences_link
from clarion.tasks.producer import Enqueued, notify, notify_many, register_recipient

__all__ = ["Enqueued", "notify", "notify_many", "preferences_link", "register_recipient"]
