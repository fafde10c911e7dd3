"""Typed settings, read once from CLARION_* environment variables. Nothing else reads the environment.

With no CLARION_DATABASE_URL / CLARION_REDIS_URL, the URLs come from the embedded services
(`db.embedded`), which publish them in `<home>/embedded.json` while they run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from clarion.errors import ConfigurationError, ServicesUnavailable

EMBEDDED_FILE = "embedded.json"


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=lambda: Path.cwd() / ".clarion")
    database_url: str | None = None
    redis_url: str | None = None
    broker_url: str | None = None
    catalog: Path | None = None
    claim_lease: float = 60.0  # seconds a claim holds the right to send (PostgreSQL's clock)
    send_timeout: float = 20.0  # hard budget of one send, all its provider calls together
    catalog_skew_grace: float = 600.0  # seconds a type/version unknown here waits for a newer worker
    republish_cap: float = 300.0  # longest wait between republishes of a row that makes no progress
    stray_after: float = 30.0  # seconds before a published-but-untouched row is published again
    max_attempts: int = 8
    batch_size: int = 100
    send_concurrency: int = 8  # sends in flight at once within one deliver batch
    webhook_url: str | None = None  # default endpoint for webhook types without config.webhook.url
    webhook_secret: str = "clarion-dev-secret"
    webhook_timeout: float = 10.0
    visibility_timeout: int = 600
    tick_interval: float = 1.0
    series_grace: float = 7200.0  # an occurrence later than this is recorded as missed, not sent
    slack_token: str | None = None  # bot token; the slack channel exists when it is set
    slack_api_url: str = "https://slack.com/api/"
    slack_signing_secret: str | None = None
    teams_app_id: str | None = None  # the teams channel exists when it is set ("none": no auth, local only)
    teams_app_password: str | None = None
    teams_tenant_id: str | None = None
    faults: str = ""
    faults_dir: Path | None = None

    def urls(self) -> tuple[str, str, str]:
        """(database, redis, broker) URLs: explicit settings first, else the running embedded services."""
        db, redis = self.database_url, self.redis_url
        if not (db and redis):
            embedded = read_embedded(self.home)
            if embedded is None:
                missing = [n for n, v in (("CLARION_DATABASE_URL", db), ("CLARION_REDIS_URL", redis)) if not v]
                raise ServicesUnavailable(
                    f"{' and '.join(missing)} not set and no embedded services are running in "
                    f"{self.home}; start them with `clarion services` or set the variables"
                )
            db = db or embedded["database_url"]
            redis = redis or embedded["redis_url"]
        return db, redis, self.broker_url or redis


def read_embedded(home: Path) -> dict | None:
    """The URLs published by a live embedded-services process, or None."""
    path = home / EMBEDDED_FILE
    try:
        data = json.loads(path.read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


def _convert(name: str, kind: type | str, raw: str):
    try:
        if kind in (float, "float"):
            return float(raw)
        if kind in (int, "int"):
            return int(raw)
        if "Path" in str(kind):
            return Path(raw)
        return raw
    except ValueError as exc:
        raise ConfigurationError(f"CLARION_{name.upper()}={raw!r} is not a valid {kind}") from exc


def from_env(environ: dict[str, str] | os._Environ = os.environ) -> Settings:
    """Build Settings from CLARION_* variables; unknown CLARION_* names are an error."""
    known = {f.name: f for f in fields(Settings)}
    values = {}
    for key, raw in environ.items():
        if not key.startswith("CLARION_") or raw == "":
            continue
        name = key.removeprefix("CLARION_").lower()
        if name not in known:
            raise ConfigurationError(f"unknown setting {key}")
        values[name] = _convert(name, known[name].type, raw)
    return Settings(**values)


@lru_cache(maxsize=1)
def get() -> Settings:
    """The process-wide settings (read on first use, not at import)."""
    return from_env()


def reset() -> None:
    """Forget cached settings so the next get() reads the environment again (tests, launchers)."""
    get.cache_clear()
