"""`clarion preview` and the rendering under `clarion send --dry-run`, run as the installed command:
what a recipient would get, built by the adapters' own request code, in their locale."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clarion.catalog.model import EXAMPLES
from clarion.tasks import register_recipient
from tests.support.environment import reset_process_state

pytestmark = pytest.mark.acceptance

CLARION = Path(sys.executable).parent / "clarion"
DEMO = {
    "CLARION_CATALOG": str(EXAMPLES / "demo.yaml"),
    # email and SMS configured (a dry run calls neither): so the plan delivers on them
    "CLARION_SMTP_URL": "smtp://127.0.0.1:9",
    "CLARION_TWILIO_ACCOUNT_SID": "AC" + "0" * 32,
    "CLARION_TWILIO_AUTH_TOKEN": "token",
    "CLARION_TWILIO_FROM": "+15555550000",
}
TYPE = "order_delayed"  # the demo's type in en, de, de-AT, fr, es on email, slack, sms, push


@pytest.fixture
def cli(clarion_env, monkeypatch):
    for key, value in DEMO.items():
        monkeypatch.setenv(key, value)
    reset_process_state()
    env = {**os.environ, **clarion_env.env, **DEMO}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLARION), *args], env=env, capture_output=True, text=True, timeout=120
        )

    return run


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def value(out: str, field: str) -> str:
    """The value column of a `field  value` row of a preview table."""
    found = re.search(rf"^{re.escape(field)}\s{{2,}}(.*)$", out, re.M)
    assert found, f"no {field!r} row in:\n{out}"
    return found[1]


def test_preview_shows_every_channel_of_a_type_with_the_versions_samples(cli):
    out = ok(cli("preview", TYPE))
    heads = [line for line in out.splitlines() if " — " in line]
    assert heads == [f"{c} — {TYPE} v1, locale en" for c in ("email", "slack", "sms", "push")]
    assert value(out, "subject") == "Order A-1042 is delayed"
    assert value(out, "encoding") == "GSM-7" and value(out, "segments") == "1 (54 characters)"
    assert '"type":"header"' in value(out, "block")
    assert value(out, "collapse id") == "order_delayed:preview"


@pytest.mark.parametrize(
    ("locale", "chain", "title", "sms_encoding"),
    [
        ("de", "de → en", "Bestellung A-1042 verspätet sich", "GSM-7"),
        ("de_AT", "de-AT → de → en", "Bestellung A-1042 verzögert sich", "GSM-7"),
        ("fr", "fr → en", "La commande A-1042 est retardée", "GSM-7"),
        ("es-MX", "es → en (asked es-MX)", "Tu pedido A-1042 se retrasa", "UCS-2"),  # á
    ],
)
def test_preview_in_a_locale_renders_its_strings_through_the_fallback_chain(
    cli, locale, chain, title, sms_encoding
):
    out = ok(cli("preview", TYPE, "--locale", locale))
    assert f"email — {TYPE} v1, locale {chain}" in out
    assert value(out, "subject") == title
    assert value(out, "title") == title  # push
    assert value(out, "encoding") == sms_encoding


def test_preview_json_is_the_provider_requests(cli):
    out = ok(cli("preview", TYPE, "--channel", "sms", "--locale", "es", "--json"))
    [sms] = json.loads(out)
    assert sms["channel"] == "sms" and sms["locale"] == "es" and sms["version"] == 1
    assert sms["request"]["body"] == "Tu pedido A-1042 se retrasa: llegará el 2026-12-09."
    assert sms["request"]["encoding"] == "UCS-2" and sms["request"]["segments"] == 1
    assert sms["request"]["to"] == "+15555550100"
    out = ok(cli("preview", TYPE, "--channel", "slack", "--var", "first_name=<!channel>", "--json"))
    [slack] = json.loads(out)
    assert "&lt;!channel&gt;" in slack["request"]["blocks"][1]["text"]["text"]  # escaped


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "clarion: unknown notification type 'nope'"),
        ([TYPE, "--channel", "teams"], f"clarion: type '{TYPE}' has no channel 'teams'"),
        ([TYPE, "--version", "9"], f"clarion: type '{TYPE}' has no version 9 (it has: 1)"),
        ([TYPE, "--locale", "ja"], f"clarion: type '{TYPE}' v1 has no strings for locale 'ja'"),
        ([TYPE, "--locale", "d!"], "clarion: --locale 'd!' is not a language tag"),
        ([TYPE, "--var", "x"], "clarion: --var takes name=value, not 'x'"),
    ],
)
def test_an_unknown_type_channel_version_or_locale_is_one_line_and_exit_2(cli, args, message):
    result = cli("preview", *args)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(message), line


def test_send_dry_run_shows_what_the_recipient_would_get_in_their_locale(cli):
    register_recipient(
        "ana",
        timezone="Europe/Vienna",
        locale="de-AT",
        addresses={"email": "ana@example.com", "sms": "+436601234567"},
    )
    args = ["--var", "first_name=Ana", "--var", "order_number=B-7", "--var", "new_date=Freitag"]
    out = ok(cli("send", TYPE, "--user", "ana", "--dry-run", *args))
    plan, shown = out.split("\nwhat the recipient would get:\n")
    assert plan.startswith("dry run — outcome: deliver on email, sms")
    heads = [line for line in shown.splitlines() if " — " in line]
    assert heads == [f"{c} — {TYPE} v1, locale de-AT → de → en" for c in ("email", "sms")]
    assert re.search(r"^to\s+ana@example.com$", shown, re.M)
    assert re.search(r"^to\s+\+436601234567$", shown, re.M)
    assert value(shown, "subject") == "Bestellung B-7 verzögert sich"
    assert value(shown, "body") == "Bestellung B-7 verspätet sich: sie kommt am Freitag."
    preview = ok(cli("preview", TYPE, "--channel", "email", "--locale", "de-AT", *args))
    assert value(preview, "text") == value(shown, "text")  # the same rendering
