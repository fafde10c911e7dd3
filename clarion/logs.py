"""How every clarion process logs: plain text, or one JSON object per line
(`CLARION_LOG_FORMAT=json`: time, level, logger, message, process, action and exception).

The beat's control tasks (the tick every second, alerts, refreshes) are not news: Celery's own
"received", "succeeded" and "Sending due task" lines for them are DEBUG, not INFO, so an idle
deployment writes nothing at INFO (`quiet_control_tasks`)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

# Celery's loggers that write one INFO line per task received, run or sent by beat.
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.beat")
TEXT = "[%(asctime)s: %(levelname)s/%(name)s] %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback goes in `exception`)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        action = getattr(record, "action", None)
        if action is not None:
            line["action"] = action
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, default=str)


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT)


def configure(fmt: str, level: int = logging.INFO) -> None:
    """The root logger writes to stderr in `fmt` (a CLI command or a supervisor)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def reformat(logger: logging.Logger, fmt: str) -> None:
    """Give every handler of `logger` the `fmt` formatter (Celery's, after it set them up)."""
    if fmt == "json":
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())


def uvicorn_config(fmt: str) -> dict[str, Any]:
    """uvicorn's `log_config` for `fmt`: its error and access loggers on stderr."""
    factory = {"()": f"{__name__}.JsonFormatter"} if fmt == "json" else {"format": TEXT}
    handler = {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"line": factory},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": "INFO"},
        "loggers": {
            "uvicorn": {"level": "INFO"},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"level": "INFO"},
        },
    }


class ControlTasksAtDebug(logging.Filter):
    """Celery's per-task lines about `names` become DEBUG lines (dropped unless DEBUG is on)."""

    def __init__(self, names: Collection[str]) -> None:
        super().__init__()
        self.names = frozenset(names)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or _task_name(record) not in self.names:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _task_name(record: logging.LogRecord) -> object:
    data = getattr(record, "data", None)  # strategy's "received", trace's "succeeded"
    if isinstance(data, dict):
        return data.get("name")
    args = record.args  # beat: "Scheduler: Sending due task %s (%s)", entry name and task
    if record.name == "celery.beat" and isinstance(args, tuple) and len(args) == 2:
        return args[1]
    return None


def quiet_control_tasks(names: Collection[str]) -> None:
    """Install ControlTasksAtDebug on Celery's per-task loggers (idempotent)."""
    for name in PER_TASK_LOGGERS:
        logger = logging.getLogger(name)
        logger.filters[:] = [f for f in logger.filters if not isinstance(f, ControlTasksAtDebug)]
        logger.addFilter(ControlTasksAtDebug(names))


def say_json(msg: str, f: Any = sys.__stderr__) -> None:
    """celery.apps.worker.safe_say as one JSON line: the worker's shutdown notices, written from a
    signal handler straight to the stream (no logging locks there)."""
    record = logging.LogRecord("celery.apps.worker", logging.WARNING, "", 0, msg, None, None)
    print(JsonFormatter().format(record), file=f, flush=True)
