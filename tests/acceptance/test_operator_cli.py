"""Operator commands as ops run them: `clarion suppressions list|lift`, `clarion keys` with expiry
and last use, and `clarion explain` with next attempts and incidents — a real subprocess against a
real PostgreSQL database (one per test) and Redis. Sends go to the real webhook receiver (or a
stand-in that answers a fixed status) and are counted there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from clarion import clock, settings
from clarion.db import gating
from clarion.db.engine import engine
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.route import route
from tests.support.endpoint import Endpoint
from tests.support.pipeline import configure, count, frozen_clock, rows

pytestmark = pytest.mark.acceptance

CLARION = Path(sys.executable).parent / "clarion"
ORDER = {"order": "A-1"}


@pytest.fixture
def cli(clarion_env):
    """`cli("suppressions", ...)`: the installed command against this test's database."""

    def run(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, **clarion_env.env}
        return subprocess.run(
            [str(CLARION), *args], env=env, capture_output=True, text=True, timeout=120
        )

    return run


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    with Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        yield running


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2 and result.stdout == "", (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("clarion: ")
    return line


def send(user: str, event: str) -> int:
    """Notify and route one receipt in this process, as a lane worker would; its request id."""
    request = notify(user, "receipt", event_id=event, variables=ORDER)
    assert route([user], [request.request_id]) == 1
    return request.request_id


def suppress(user: str, address: str) -> None:
    """List the address as the receipt path does after a hard bounce."""
    with engine().begin() as conn:
        gating.suppress_address(
            conn,
            user,
            channel="webhook",
            address=address,
            reason="bounced",
            detail="550 mailbox unavailable",
            now=clock.now(),
        )


# --- suppressions --------------------------------------------------------------------------------


def test_a_lifted_suppression_lets_the_next_send_go_and_the_lift_is_audited(cli, receiver):
    register_recipient("ann", timezone="Europe/Berlin")  # no webhook address: her user id is it
    register_recipient("bob", timezone="Europe/Berlin")
    suppress("ann", "ann")
    suppress("bob", "bob")
    send("ann", "before")
    assert receiver.arrivals.total == 0
    assert rows("SELECT reason FROM decisions WHERE gate = 'suppression'") == [
        {"reason": "suppressed_address"}
    ]

    listed = ok(cli("suppressions", "list", "--channel", "webhook"))
    assert re.search(r"^\S+ \S+\s+ann\s+webhook\s+ann\s+bounced\s+550 mailbox", listed, re.M)
    assert re.search(r"^\S+ \S+\s+bob\s+webhook\s+bob\s+bounced", listed, re.M)
    only_ann = ok(cli("suppressions", "list", "--user", "ann"))
    assert " bob " not in only_ann and re.search(r"\sann\s+webhook\s+ann\s", only_ann)

    started = datetime.now(UTC)
    out = ok(
        cli(
            "suppressions", "lift", "--user", "ann", "--channel", "webhook", "--address", "ann",
            "--reason", "false bounce, ticket 812", "--by", "dana",
        )
    )  # fmt: skip
    assert out.startswith("lifted: webhook address ann of ann (was bounced, listed ")
    [audit] = rows("SELECT * FROM suppression_lifts")
    assert {
        k: audit[k] for k in ("user_id", "channel", "address", "reason", "lifted_by", "why")
    } == {
        "user_id": "ann",
        "channel": "webhook",
        "address": "ann",
        "reason": "bounced",
        "lifted_by": "dana",
        "why": "false bounce, ticket 812",
    }
    assert started - timedelta(seconds=5) <= audit["lifted_at"] <= datetime.now(UTC)
    assert audit["suppressed_at"] < audit["lifted_at"]
    assert count("suppressions") == 1  # bob's stays

    send("ann", "after")
    send("bob", "after")
    assert receiver.arrivals.total == 1 and receiver.arrivals.unique == 1  # ann's, not bob's

    log = ok(cli("suppressions", "list", "--lifted"))
    assert re.search(
        r"^\S+ \S+\s+dana\s+false bounce, ticket 812\s+ann\s+webhook\s+ann\s+bounced\s+\S+ \S+$",
        log,
        re.M,
    ), log
    assert "(none)" in ok(cli("suppressions", "list", "--user", "ann"))


def test_lifting_an_entry_that_is_not_listed_is_refused_and_writes_nothing(cli):
    register_recipient("ann", timezone="Europe/Berlin")
    suppress("ann", "ann")
    lift = ["suppressions", "lift", "--user", "ann", "--channel", "webhook", "--reason", "x"]
    line = refused(cli(*lift, "--address", "someone-else"))
    assert line == (
        "clarion: no suppression for user 'ann' on webhook address 'someone-else' "
        "(see `clarion suppressions list`)"
    )
    assert refused(cli(*lift[:-1], " ", "--address", "ann")).startswith("clarion: --reason: ")
    assert count("suppression_lifts") == 0 and count("suppressions") == 1

    ok(cli(*lift, "--address", "ann"))
    assert refused(cli(*lift, "--address", "ann")).startswith("clarion: no suppression for")
    assert count("suppression_lifts") == 1 and count("suppressions") == 0


# --- keys ----------------------------------------------------------------------------------------


def test_keys_create_with_expiry_and_list_shows_expiry_and_last_use(cli, clarion_env):
    from starlette.testclient import TestClient

    from clarion.web.app import create_app

    made = cli("keys", "create", "--name", "billing", "--scope", "events:write", "--expires", "90d")
    secret = ok(made).strip()
    created = datetime.now(UTC)
    assert re.search(r"; expires \d{4}-\d\d-\d\d \d\d:\d\d UTC; shown once", made.stderr)
    [row] = rows("SELECT prefix, created_at, expires_at, last_used_at FROM api_keys")
    assert row["expires_at"] - row["created_at"] == timedelta(days=90)
    assert row["last_used_at"] is None
    listed = ok(cli("keys", "list"))
    expires = row["expires_at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    header = listed.splitlines()[1].split()
    assert header == ["prefix", "name", "scopes", "rate", "created", "last", "used", "expires",
                      "revoked"]  # fmt: skip
    assert re.search(rf"^{row['prefix']}\s+billing\s+events:write\s+100/1s\s+\S+ \S+\s+{expires}$",
                     listed, re.M), listed  # fmt: skip

    register_recipient("ann", timezone="Europe/Berlin")
    with TestClient(create_app()) as client:
        body = {"event_id": "e1", "user_id": "ann", "type": "receipt", "variables": ORDER}
        answer = client.post("/v1/events", json=body, headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 202
    used = rows("SELECT last_used_at FROM api_keys")[0]["last_used_at"]
    assert created - timedelta(seconds=5) <= used <= datetime.now(UTC)
    shown = used.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    assert re.search(rf"^{row['prefix']}\s.*\s{shown}\s+{expires}$", ok(cli("keys", "list")), re.M)

    assert refused(cli("keys", "create", "--name", "x", "--scope", "events:write",
                       "--expires", "forever")).startswith("clarion: --expires takes")  # fmt: skip
    assert count("api_keys") == 1


# --- explain -------------------------------------------------------------------------------------


def test_explain_prints_the_next_attempt_of_a_deferred_delivery_and_incidents(cli, monkeypatch):
    register_recipient("ann", timezone="Europe/Berlin")
    ahead = datetime.now(UTC) + timedelta(hours=1, minutes=3)  # due in 1h 3m from now
    with frozen_clock(ahead), Endpoint(lambda call: 408) as endpoint:  # not taken: retried later
        configure(monkeypatch, webhook_url=endpoint.url)
        retrying = send("ann", "e-retry")
    with Endpoint(lambda call: 409) as endpoint:  # "already had this key": a repeat incident
        configure(monkeypatch, webhook_url=endpoint.url)
        repeated = send("ann", "e-repeat")
    [row] = rows(
        "SELECT greatest(not_before, due_at) AS at FROM deliveries WHERE state = 'pending'"
    )
    at = row["at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")

    for args in (("ann",), ("--user", "ann")):  # the documented form and the flag
        out = ok(cli("explain", *args))
        blocks = {b.splitlines()[0].split()[1]: b for b in out.split("\n\n")}
        pending = blocks[str(retrying)]
        # the CLI reads the real clock, a little later than `ahead` was taken: 1h 0m to 1h 3m
        title = rf" — being delivered; next attempt {at} UTC \(in 1h [0-3]m\)$"
        assert re.search(title, pending.splitlines()[0]), pending
        row_re = rf"^next\s+{at}\s+webhook\s+attempt\s+#2\s+in 1h [0-3]m$"
        assert re.search(row_re, pending, re.M), pending
        incident = blocks[str(repeated)]
        assert re.search(r"^incident\s+\S+ \S+\s+webhook\s+repeat\s+the provider already had",
                         incident, re.M), incident  # fmt: skip
        assert "next " not in incident

    line = refused(cli("explain", "ann", "--user", "bob"))
    assert line == "clarion: name one recipient: `explain USER` or `explain --user USER`"
    assert refused(cli("explain")) == line
