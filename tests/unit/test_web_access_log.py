"""`clarion web` writes no line per request unless asked (--access-log): the flag reaches uvicorn's
config for the public listener."""

from __future__ import annotations

from clarion.ops.cli import parser
from clarion.web.server import WebOptions, public_config


def test_the_access_log_is_off_by_default_and_on_when_asked() -> None:
    assert parser().parse_args(["web"]).access_log is False
    assert parser().parse_args(["web", "--access-log"]).access_log is True
    assert public_config(WebOptions()).access_log is False
    assert public_config(WebOptions(access_log=True)).access_log is True
