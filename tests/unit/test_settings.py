"""clarion/settings.py: typed settings from CLARION_* variables, and where the service URLs come from."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clarion.errors import ConfigurationError, ServicesUnavailable
from clarion.settings import EMBEDDED_FILE, Settings, from_env, read_embedded


@pytest.mark.parametrize(
    ("environ", "field", "value"),
    [
        ({"CLARION_MAX_ATTEMPTS": "3"}, "max_attempts", 3),
        ({"CLARION_BATCH_SIZE": "250"}, "batch_size", 250),
        ({"CLARION_VISIBILITY_TIMEOUT": "3600"}, "visibility_timeout", 3600),
        ({"CLARION_CLAIM_LEASE": "2.5"}, "claim_lease", 2.5),
        ({"CLARION_CLAIM_LEASE": "30"}, "claim_lease", 30.0),
        ({"CLARION_STRAY_AFTER": "1e1"}, "stray_after", 10.0),
        ({"CLARION_WEBHOOK_TIMEOUT": "0.5"}, "webhook_timeout", 0.5),
        ({"CLARION_TICK_INTERVAL": "0.25"}, "tick_interval", 0.25),
        ({"CLARION_HOME": "/tmp/clarion-home"}, "home", Path("/tmp/clarion-home")),
        ({"CLARION_CATALOG": "cat.yaml"}, "catalog", Path("cat.yaml")),
        ({"CLARION_FAULTS_DIR": "/tmp/f"}, "faults_dir", Path("/tmp/f")),
        ({"CLARION_PARTITIONS": "4"}, "partitions", 4),
        ({"CLARION_RETENTION_DAYS": "30"}, "retention_days", 30),
        ({"CLARION_ACTIVATION_PER_SECOND": "300"}, "activation_per_second", 300.0),
        (
            {"CLARION_DATABASE_URL": "postgresql://x/y", "CLARION_WEBHOOK_SECRET": "s3"},
            "database_url",
            "postgresql://x/y",
        ),
        ({"CLARION_REDIS_URL": "redis://h:1/2"}, "redis_url", "redis://h:1/2"),
        ({"CLARION_BROKER_URL": "redis://b/0"}, "broker_url", "redis://b/0"),
        ({"CLARION_WEBHOOK_URL": "http://127.0.0.1:9/h"}, "webhook_url", "http://127.0.0.1:9/h"),
        ({"CLARION_WEBHOOK_SECRET": "42"}, "webhook_secret", "42"),  # stays a string
        ({"CLARION_FAULTS": "route.before_commit=raise"}, "faults", "route.before_commit=raise"),
    ],
)
def test_conversions(environ: dict[str, str], field: str, value: object) -> None:
    settings = from_env(environ)
    assert getattr(settings, field) == value
    assert type(getattr(settings, field)) is type(value)


def test_defaults_and_unrelated_variables() -> None:
    settings = from_env(
        {"PATH": "/bin", "HOME": "/root", "clarion_max_attempts": "x", "XCLARION_A": "1"}
    )
    assert settings == Settings(home=settings.home)
    assert settings.max_attempts == 8
    assert settings.database_url is None
    assert settings.home == Path.cwd() / ".clarion"


@pytest.mark.parametrize(
    "environ",
    [
        {"CLARION_MAX_ATTEMPTS": ""},
        {"CLARION_CLAIM_LEASE": ""},
        {"CLARION_DATABASE_URL": ""},
        {"CLARION_HOME": ""},
        {"CLARION_NOT_A_SETTING": ""},  # even an unknown name is ignored when empty
        {"CLARION_WEBHOOK_URL": ""},
    ],
)
def test_empty_values_are_ignored(environ: dict[str, str]) -> None:
    assert from_env(environ) == from_env({})


@pytest.mark.parametrize(
    "name", ["CLARION_DATABSE_URL", "CLARION_URLS", "CLARION_", "CLARION_home_x"]
)
def test_unknown_variable_is_an_error(name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"unknown setting {name}"):
        from_env({name: "1"})


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("CLARION_CLAIM_LEASE", "sixty"),
        ("CLARION_CLAIM_LEASE", "60s"),
        ("CLARION_WEBHOOK_TIMEOUT", "1,5"),
        ("CLARION_MAX_ATTEMPTS", "3.5"),
        ("CLARION_MAX_ATTEMPTS", "many"),
        ("CLARION_BATCH_SIZE", "1e3"),
    ],
)
def test_bad_number_is_an_error(name: str, raw: str) -> None:
    with pytest.raises(
        ConfigurationError, match=rf"^{name}={re.escape(repr(raw))} is not a valid (float|int)$"
    ) as caught:
        from_env({name: raw})
    assert name in str(caught.value) and repr(raw) in str(caught.value)
    assert isinstance(caught.value.__cause__, ValueError)


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("CLARION_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("CLARION_BATCH_SIZE", "7")
    assert from_env(os.environ).batch_size == 7


# --- urls() -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("database_url", "redis_url", "names"),
    [
        (None, None, "CLARION_DATABASE_URL and CLARION_REDIS_URL not set"),
        ("postgresql://x/y", None, "CLARION_REDIS_URL not set"),
        (None, "redis://r/0", "CLARION_DATABASE_URL not set"),
    ],
)
def test_urls_without_services_explains_what_to_do(
    tmp_path: Path, database_url: str | None, redis_url: str | None, names: str
) -> None:
    home = tmp_path / "home"
    with pytest.raises(
        ServicesUnavailable, match=rf"^{names} and no embedded services are running in "
    ) as caught:
        Settings(home=home, database_url=database_url, redis_url=redis_url).urls()
    message = str(caught.value)
    assert message.startswith(names)
    assert str(home) in message
    assert "clarion services" in message
    assert isinstance(caught.value, ConfigurationError)


def test_explicit_urls_need_no_embedded_services(tmp_path: Path) -> None:
    s = Settings(home=tmp_path, database_url="postgresql://d/b", redis_url="redis://r/1")
    assert s.urls() == ("postgresql://d/b", "redis://r/1", "redis://r/1")
    s = Settings(
        home=tmp_path,
        database_url="postgresql://d/b",
        redis_url="redis://r/1",
        broker_url="redis://b/2",
    )
    assert s.urls() == ("postgresql://d/b", "redis://r/1", "redis://b/2")


def write_embedded(home: Path, pid: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / EMBEDDED_FILE).write_text(
        json.dumps(
            {"pid": pid, "database_url": "postgresql://emb/db", "redis_url": "redis://emb/0"}
        )
    )


def test_urls_from_live_embedded_services(tmp_path: Path) -> None:
    write_embedded(tmp_path, os.getpid())  # a live process: this one
    assert Settings(home=tmp_path).urls() == (
        "postgresql://emb/db",
        "redis://emb/0",
        "redis://emb/0",
    )
    assert Settings(home=tmp_path, redis_url="redis://mine/3").urls() == (
        "postgresql://emb/db",
        "redis://mine/3",
        "redis://mine/3",
    )


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    "content",
    [None, "", "{not json", "{}", json.dumps({"database_url": "x", "redis_url": "y"}), "dead"],
)
def test_stale_or_broken_embedded_file_means_no_services(
    tmp_path: Path, content: str | None
) -> None:
    if content == "dead":
        write_embedded(tmp_path, dead_pid())
    elif content is not None:
        (tmp_path / EMBEDDED_FILE).write_text(content)
    assert read_embedded(tmp_path) is None
    with pytest.raises(
        ServicesUnavailable, match=r"not set and no embedded services are running in "
    ):
        Settings(home=tmp_path).urls()


# --- ranges, secrets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("CLARION_BATCH_SIZE", "0"),
        ("CLARION_BATCH_SIZE", "-5"),
        ("CLARION_SEND_CONCURRENCY", "0"),
        ("CLARION_SEND_CONCURRENCY", "-1"),
        ("CLARION_SENT_FLUSH_ROWS", "0"),
        ("CLARION_SENT_FLUSH_MS", "0"),
        ("CLARION_MAX_ATTEMPTS", "0"),
        ("CLARION_TICK_INTERVAL", "0"),
        ("CLARION_TICK_INTERVAL", "-0.5"),
        ("CLARION_CLAIM_LEASE", "0"),
        ("CLARION_CLAIM_LEASE", "nan"),
        ("CLARION_CLAIM_LEASE", "inf"),
        ("CLARION_STRAY_AFTER", "0"),
        ("CLARION_WEBHOOK_TIMEOUT", "-1"),
        ("CLARION_VISIBILITY_TIMEOUT", "0"),
        ("CLARION_SERIES_GRACE", "0"),
        ("CLARION_VARIABLES_MAX_DEPTH", "0"),
        ("CLARION_VARIABLES_MAX_BYTES", "1"),
        ("CLARION_ACTIVATION_PER_SECOND", "0.5"),
        ("CLARION_ACTIVATION_PER_SECOND", "inf"),
    ],
)
def test_out_of_range_values_are_refused(name: str, raw: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        from_env({name: raw})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"batch_size": 0}, "CLARION_BATCH_SIZE=0 must be >= 1"),
        ({"batch_size": 2.5}, "CLARION_BATCH_SIZE must be a int"),
        ({"batch_size": True}, "CLARION_BATCH_SIZE must be a int"),
        ({"claim_lease": "60"}, "CLARION_CLAIM_LEASE must be a float"),
        ({"home": "/tmp"}, "CLARION_HOME must be a Path"),
        ({"webhook_secret": None}, "CLARION_WEBHOOK_SECRET must be a str"),
    ],
)
def test_settings_built_in_code_are_checked_too(values: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings(**values)


def test_smallest_allowed_values_are_accepted() -> None:
    s = from_env(
        {
            "CLARION_BATCH_SIZE": "1",
            "CLARION_SEND_CONCURRENCY": "1",
            "CLARION_MAX_ATTEMPTS": "1",
            "CLARION_TICK_INTERVAL": "0.01",
            "CLARION_VARIABLES_MAX_DEPTH": "1",
        }
    )
    assert (
        s.batch_size,
        s.send_concurrency,
        s.max_attempts,
        s.tick_interval,
        s.variables_max_depth,
    ) == (1, 1, 1, 0.01, 1)


def test_variable_caps_default_to_16_levels_and_64_kib() -> None:
    assert (Settings().variables_max_depth, Settings().variables_max_bytes) == (16, 65536)


SECRETS: dict[str, Any] = {
    "webhook_secret": "hook-s3cret",
    "slack_token": "xoxb-s3cret",
    "slack_signing_secret": "sign-s3cret",
    "teams_app_password": "teams-s3cret",
}


def test_secrets_and_url_passwords_never_show_in_repr() -> None:
    s = Settings(
        **SECRETS,
        database_url="postgresql://clarion:db-s3cret@db:5432/clarion",
        redis_url="redis://:redis-s3cret@cache:6379/0",
        broker_url="amqp://guest:amqp-s3cret@mq:5672//",
        webhook_url="https://u:hook-pw@h/x",
    )
    shown = repr(s) + str(s)
    assert "s3cret" not in shown and "hook-pw" not in shown
    assert "postgresql://clarion:***@db:5432/clarion" in shown
    assert "redis://:***@cache:6379/0" in shown
    assert "webhook_secret='***'" in shown
    assert "slack_signing_secret='***'" in shown
    assert s.slack_token == "xoxb-s3cret"  # the value itself is untouched


def test_unset_secrets_show_as_none() -> None:
    assert "slack_token=None" in repr(Settings())


@pytest.mark.parametrize(
    "name",
    [
        "CLARION_WEBHOOK_SECRET",
        "CLARION_SLACK_TOKEN",
        "CLARION_SLACK_SIGNING_SECRET",
        "CLARION_TEAMS_APP_PASSWORD",
    ],
)
def test_an_empty_secret_is_an_error_not_a_fallback(name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{name} is set but empty"):
        from_env({name: ""})


@pytest.mark.parametrize("secret", [None, "clarion-dev-secret"])
def test_the_development_secret_is_refused_with_an_explicit_database(secret: str | None) -> None:
    environ = {"CLARION_DATABASE_URL": "postgresql://db/clarion"}
    if secret:
        environ["CLARION_WEBHOOK_SECRET"] = secret
    with pytest.raises(ConfigurationError, match="CLARION_WEBHOOK_SECRET") as caught:
        from_env(environ)
    assert "postgresql://db" not in str(caught.value)


def test_the_development_secret_is_fine_on_the_embedded_default() -> None:
    assert from_env({"CLARION_REDIS_URL": "redis://r/0"}).webhook_secret == "clarion-dev-secret"
    own = from_env({"CLARION_DATABASE_URL": "postgresql://db/c", "CLARION_WEBHOOK_SECRET": "mine"})
    assert own.webhook_secret == "mine"


@pytest.mark.parametrize(
    "bad", ["public", "Clarion", "a-b", "x; DROP TABLE requests", "pg_clarion", "a" * 53, "1st"]
)
def test_the_schema_is_an_identifier_not_public_naming_the_variable(bad):
    with pytest.raises(ConfigurationError, match="CLARION_SCHEMA=.*lower-case identifier"):
        from_env({"CLARION_SCHEMA": bad})


def test_the_schema_defaults_to_clarion_and_takes_another_name():
    assert from_env({}).schema == "clarion"
    assert from_env({"CLARION_SCHEMA": "acme_notify"}).schema == "acme_notify"
