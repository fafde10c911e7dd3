"""clarion/sentinel.py's URL form (kombu's sentinel://) and the settings that go with it."""

from __future__ import annotations

import pytest

from clarion import sentinel
from clarion.errors import ConfigurationError
from clarion.settings import from_env

URL = "sentinel://10.0.0.1:26379;sentinel://:s3cret@10.0.0.2:26380;sentinel://10.0.0.3/2"


def test_every_sentinel_the_database_and_the_password_are_read():
    assert sentinel.parse(URL) == (
        [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)],
        2,
        "s3cret",
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sentinel://a:26379;redis://b:6379", "'redis://b:6379' is not sentinel://host:port"),
        ("sentinel://a:port", "the port is not a number"),
        ("sentinel://a:26379/zero", "the database after '/' must be a number"),
    ],
)
def test_a_malformed_url_is_refused_naming_the_setting(url, problem):
    with pytest.raises(ConfigurationError, match=f"CLARION_BROKER_URL: .*{problem}"):
        from_env({"CLARION_BROKER_URL": url, "CLARION_SENTINEL_MASTER": "clarion"})


def test_a_sentinel_redis_url_needs_the_masters_name():
    with pytest.raises(ConfigurationError, match="CLARION_REDIS_URL is a Redis Sentinel URL"):
        from_env({"CLARION_REDIS_URL": URL})


def test_kombu_gets_the_masters_name_and_timeouts_for_a_sentinel_broker_only():
    options = sentinel.transport_options(URL, "clarion")
    assert options["master_name"] == "clarion"
    assert options["socket_timeout"] == sentinel.SOCKET_TIMEOUT
    assert options["sentinel_kwargs"]["socket_connect_timeout"] == sentinel.SENTINEL_TIMEOUT
    assert sentinel.transport_options("redis://127.0.0.1:6379/0", "clarion") == {}
