"""Celery tasks and the producer API.

from tasks import notify, register_recipient, preferences_link
"""

from tasks.links import preferences_link
from tasks.producer import Enqueued, notify, notify_many, register_recipient

__all__ = ["Enqueued", "notify", "notify_many", "preferences_link", "register_recipient"]
