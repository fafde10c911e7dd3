"""The Celery app. Workers run `celery -A tasks.app worker`; `clarion worker` does that for you."""

import kombu.pools
from celery import Celery
from celery.signals import worker_init, worker_process_init

from clarion import settings

app = Celery("clarion", include=["tasks.route", "tasks.deliver", "tasks.tick"])
app.config_from_object("celeryconfig")


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked child must not share its parent's database or HTTP connections.
    from db import engine

    engine.dispose_all()


@worker_init.connect
def _require_services(**_: object) -> None:
    # A worker without a database and broker is a configuration error: say so at start.
    use_broker(settings.get().urls()[2])


def use_broker(url: str) -> None:
    """Publish to `url` from now on (settings may be read after this module was imported)."""
    if app.conf.broker_url != url:
        kombu.pools.reset()  # close pooled connections to any other broker
        app._after_fork()  # Celery's own reset of its connection and producer pools
        app.conf.broker_url = url
