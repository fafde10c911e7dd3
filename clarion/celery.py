"""`celery -A clarion worker`: Celery finds clarion's app here (clarion.tasks.app)."""

from clarion.tasks.app import app

__all__ = ["app"]
