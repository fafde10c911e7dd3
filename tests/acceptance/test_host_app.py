"""clarion inside a real host app (issue 22's "Must show"): the wheel, installed into a fresh
virtualenv outside the source tree with no extra, serves a host app in a temporary folder that has
its own `tasks.py` (its own Celery app), a `db/` package, a `web/` package, its own Alembic history
and a table named `preferences` in the same database.

In that host: `clarion migrate` leaves the host's tables and version alone; `from clarion import
notify` inside the host's SQLAlchemy transaction is sent after commit (counted at the receiver) and
never after rollback; the host's `celery -A tasks worker` and `clarion worker` run side by side; the
host mounts clarion's app under `/notify` and `POST /notify/v1/events` is sent too.

Minutes long (a wheel and a virtualenv): the soak tier."""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from clarion.db.engine import normalise_url, one_off_engine
from clarion.standins.receiver import Receiver
from tests.support.environment import WEBHOOK_SECRET, Services, with_database
from tests.support.package import Venv, build, top_level_names

pytestmark = [pytest.mark.acceptance, pytest.mark.soak, pytest.mark.timeout(1800)]

CATALOG = """
types:
  receipt:
    category: transactional
    channels: [webhook]
    templates: [{version: 1, body: "Thanks for your order."}]
"""

HOST_TASKS = '''
"""The host's own Celery app: `celery -A tasks worker`."""
import os
from pathlib import Path

from celery import Celery

app = Celery("host", broker=os.environ["HOST_BROKER_URL"])


@app.task(name="host.touch")
def touch(path: str, word: str) -> None:
    with Path(path).open("a") as out:
        out.write(word + "\\n")
'''

HOST_DB = '''
"""The host's own database layer (a package named `db`, as clarion's folder is)."""
import os

from sqlalchemy import create_engine

engine = create_engine(os.environ["HOST_DATABASE_URL"])


def ledger() -> str:
    return "the host's ledger"
'''

HOST_WEB = '''
"""The host's own web app (a package named `web`), mounting clarion under /notify."""
from fastapi import FastAPI, Request

from clarion.web import asgi_app

app = FastAPI()


@app.middleware("http")
async def stamp(request: Request, call_next):
    response = await call_next(request)
    response.headers["x-host-app"] = "yes"
    return response


@app.get("/hello")
def hello() -> dict:
    return {"host": True}


app.mount("/notify", asgi_app())
'''

ALEMBIC_ENV = """
import os

from alembic import context
from sqlalchemy import create_engine

engine = create_engine(os.environ["HOST_DATABASE_URL"])
with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
"""

HOST_REVISION = '''
"""the host's preferences table"""
from alembic import op

revision = "host_0042"
down_revision = None


def upgrade() -> None:
    op.execute("CREATE TABLE preferences (id serial PRIMARY KEY, owner text NOT NULL)")
    op.execute("INSERT INTO preferences (owner) VALUES ('host-1'), ('host-2')")
'''

# Run inside the host folder by the venv's python: the host's own modules, then clarion's API in
# the host's transaction. argv: commit|rollback EVENT_ID
HOST_SCRIPT = """
import sys

from sqlalchemy import text

import db
import tasks
from clarion import notify, register_recipient

assert db.ledger() == "the host's ledger" and tasks.app.main == "host"
mode, event_id = sys.argv[1], sys.argv[2]
register_recipient("ann", timezone="Europe/Berlin")
with db.engine.connect() as conn:
    transaction = conn.begin()
    conn.execute(text("INSERT INTO preferences (owner) VALUES (:o)"), {"o": event_id})
    enqueued = notify("ann", "receipt", event_id=event_id, connection=conn)
    # the host's unqualified names still mean the host's tables inside this transaction
    owners = conn.execute(text("SELECT count(*) FROM preferences WHERE owner = :o"), {"o": event_id})
    assert owners.scalar() == 1
    if mode == "commit":
        transaction.commit()
    else:
        transaction.rollback()
tasks.touch.delay(sys.argv[3], event_id)
print(enqueued.request_id, enqueued.new)
"""


def write_host(folder: Path) -> None:
    files = {
        "tasks.py": HOST_TASKS,
        "db/__init__.py": HOST_DB,
        "web/__init__.py": HOST_WEB,
        "host_script.py": HOST_SCRIPT,
        "catalog.yaml": CATALOG,
        "migrations/env.py": ALEMBIC_ENV,
        "migrations/versions/host_0042.py": HOST_REVISION,
        "alembic.ini": "[alembic]\nscript_location = migrations\n",
    }
    for name, body in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body).lstrip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def redis_db(url: str, index: int) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{index}" if base.startswith("redis") and "://" in base else url


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    out = tmp_path_factory.mktemp("dist")
    built = build(out)
    names = top_level_names(built.wheel)
    print(f"top-level names in {built.wheel.name}: {names}")
    assert [n for n in names if not n.endswith(".dist-info")] == ["clarion"], names
    env = Venv.create(tmp_path_factory.mktemp("host-venv") / "venv")
    env.install(built.wheel)  # no extra: the host needs only the core
    return env


@pytest.fixture
def host_database(services: Services) -> Iterator[str]:
    name = f"host_{uuid.uuid4().hex[:12]}"
    admin = one_off_engine(services.database_url)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield with_database(services.database_url, name)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class Processes:
    def __init__(self) -> None:
        self.running: list[tuple[str, subprocess.Popen, Path]] = []

    def start(
        self, name: str, venv: Venv, command: list[str], cwd: Path, log_dir: Path, env
    ) -> None:
        log = log_dir / f"{name}.log"
        handle = log.open("w")
        process = subprocess.Popen(
            command, cwd=cwd, env=venv.env(**env), stdout=handle, stderr=subprocess.STDOUT
        )
        self.running.append((name, process, log))

    def check_alive(self) -> None:
        for name, process, log in self.running:
            if process.poll() is not None:
                raise AssertionError(
                    f"{name} exited {process.returncode}:\n{log.read_text()[-3000:]}"
                )

    def stop(self) -> None:
        for _, process, _ in self.running:
            process.terminate()
        for _, process, _ in self.running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def test_clarion_inside_a_host_app(
    venv: Venv, host_database: str, services: Services, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    write_host(host)
    touched = tmp_path / "touched.txt"
    clarion_redis = services.redis_url
    host_broker = redis_db(clarion_redis, 15)
    host_env = {"HOST_DATABASE_URL": normalise_url(host_database), "HOST_BROKER_URL": host_broker}

    with Receiver(WEBHOOK_SECRET) as receiver:
        env = {
            **host_env,
            "CLARION_HOME": str(tmp_path / "clarion-home"),
            "CLARION_DATABASE_URL": host_database,
            "CLARION_REDIS_URL": clarion_redis,
            "CLARION_CATALOG": str(host / "catalog.yaml"),
            "CLARION_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "CLARION_WEBHOOK_URL": receiver.url,
        }
        import redis

        redis.Redis.from_url(clarion_redis).flushdb()
        redis.Redis.from_url(host_broker).flushdb()

        # the host's own Alembic history first, then clarion's migrate beside it
        venv.run(str(venv.bin("alembic")), "upgrade", "head", cwd=host, **env)  # type: ignore[arg-type]
        migrated = venv.run(str(venv.bin("clarion")), "migrate", cwd=host, **env)  # type: ignore[arg-type]
        print(migrated.stdout, migrated.stderr)
        db = create_engine(normalise_url(host_database))
        with db.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM public.alembic_version")).all() == [
                ("host_0042",)
            ]
            owners = conn.execute(text("SELECT owner FROM public.preferences ORDER BY id")).all()
            assert owners == [("host-1",), ("host-2",)]
            schemas = (
                conn.execute(
                    text(
                        "SELECT DISTINCT n.nspname FROM pg_class c JOIN pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE c.relname IN ('requests', 'deliveries')"
                    )
                )
                .scalars()
                .all()
            )
            assert schemas == ["clarion"], schemas
            public = (
                conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
                )
                .scalars()
                .all()
            )
            assert public == ["alembic_version", "preferences"], public

        processes = Processes()
        logs = tmp_path / "logs"
        logs.mkdir()
        try:
            processes.start(
                "host-celery",
                venv,
                [str(venv.bin("celery")), "-A", "tasks", "worker", "-c", "1", "--loglevel", "info"],
                host,
                logs,
                env,
            )
            processes.start(
                "clarion-worker",
                venv,
                [str(venv.bin("clarion")), "worker", "--concurrency", "2"],
                host,
                logs,
                env,
            )
            processes.start(
                "clarion-beat", venv, [str(venv.bin("clarion")), "beat"], host, logs, env
            )
            port = free_port()
            processes.start(
                "host-web",
                venv,
                [str(venv.bin("uvicorn")), "web:app", "--port", str(port)],
                host,
                logs,
                env,
            )

            # notify() in the host's transaction: committed, rolled back, then committed again
            for mode, event in (
                ("commit", "order-1"),
                ("rollback", "order-2"),
                ("commit", "order-3"),
            ):
                venv.run(
                    str(venv.python),
                    "host_script.py",
                    mode,
                    event,
                    str(touched),
                    cwd=host,
                    **env,  # type: ignore[arg-type]
                )
            wait_for(
                lambda: arrived(receiver, "order-3"),
                "the second committed notification at the receiver",
                timeout=120,
            )
            processes.check_alive()
            assert arrived(receiver, "order-1") == 1, "the first commit was not sent once"
            assert arrived(receiver, "order-2") == 0, "a rolled-back notification was sent"
            with db.connect() as conn:
                events = (
                    conn.execute(text("SELECT occurrence_key FROM clarion.requests ORDER BY 1"))
                    .scalars()
                    .all()
                )
                owners = conn.execute(text("SELECT owner FROM preferences ORDER BY id")).all()
            assert events == ["event:order-1", "event:order-3"], events
            assert owners == [("host-1",), ("host-2",), ("order-1",), ("order-3",)], owners

            # the host's own Celery worker ran the host's task beside clarion's worker
            wait_for(
                lambda: touched.exists() and len(touched.read_text().split()) == 3,
                "the host's tasks",
            )
            assert sorted(touched.read_text().split()) == ["order-1", "order-2", "order-3"]

            # the host mounts clarion: POST /notify/v1/events through the host's middleware
            created = venv.run(
                str(venv.bin("clarion")),
                "keys",
                "create",
                "--name",
                "host",
                "--scope",
                "events:write",
                cwd=host,
                **env,  # type: ignore[arg-type]
            )
            key = next(w for w in created.stdout.split() if w.startswith("clk_"))
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: _answers(f"{base}/hello"), "the host's web app")
            answer = httpx.post(
                f"{base}/notify/v1/events",
                headers={"Authorization": f"Bearer {key}"},
                json={"user_id": "ann", "type": "receipt", "event_id": "order-4"},
                timeout=10,
            )
            assert answer.status_code == 202, answer.text
            assert answer.headers.get("x-host-app") == "yes"
            wait_for(
                lambda: arrived(receiver, "order-4"),
                "the event posted through the host's mount at the receiver",
                timeout=120,
            )
            processes.check_alive()
            counted = {
                e: arrived(receiver, e) for e in ("order-1", "order-2", "order-3", "order-4")
            }
            print(json.dumps({"arrivals at the receiver": counted}))
            assert counted == {"order-1": 1, "order-2": 0, "order-3": 1, "order-4": 1}
            assert sum(receiver.arrivals.by_key.values()) == 3  # nothing else, nothing twice
        finally:
            processes.stop()
            for name, _, log in processes.running:
                print(f"--- {name}\n{log.read_text()[-1500:]}")


def arrived(receiver: Receiver, event_id: str) -> int:
    """Arrivals at the receiver for ann's receipt of `event_id` (0: never)."""
    with receiver.arrivals.lock:
        keys = [
            key
            for occurrence, keys in receiver.arrivals.occurrences.items()
            if occurrence == f"ann/receipt/event:{event_id}"
            for key in keys
        ]
        return sum(receiver.arrivals.by_key[key] for key in keys)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
