"""The Celery app. Workers run `celery -A tasks.app worker`; `clarion worker` does that for you."""

from celery import Celery
from celery.signals import worker_process_init

app = Celery("clarion", include=["tasks.route", "tasks.deliver", "tasks.tick"])
app.config_from_object("celeryconfig")


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked child must not share its parent's database or HTTP connections.
    from db import engine

    engine.dispose_all()
