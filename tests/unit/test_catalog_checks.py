"""The catalog is checked at load: every template renders for every channel it targets, channel
names are known, YAML keys stay text; errors name file, type, version and field. A worker start
uses tasks.runtime.check_catalog(), which raises ConfigurationError on such a catalog."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from jinja2.exceptions import SecurityError

from clarion import settings
from clarion.catalog import Catalog, CatalogError, NotificationType, Template
from clarion.catalog.model import CHANNELS
from clarion.catalog.sandbox import MAX_OUTPUT, RenderLimitExceeded
from clarion.errors import ConfigurationError
from clarion.tasks import runtime

WEEKLY = """\
types:
  weekly_one_on_one:
    category: activation
    channels: [slack, teams]
    required: [manager]
    templates:
      - version: 1
        body: "Time for your 1:1, {{ manager }}"
      - version: 2
        body: "Time for your 1:1, {{ manager }}"
        channels:
          teams:
            body: "{{ manager | shout }}"
"""


def write(tmp_path: Path, text: str, name: str = "catalog.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_type(**spec: Any) -> str:
    base = {
        "category": "transactional",
        "channels": ["webhook"],
        "required": ["name"],
        "templates": [{"version": 1, "body": "Hi {{ name }}"}],
    }
    base.update(spec)
    try:
        Catalog.from_dict({"types": {"t": base}}, source="here.yaml")
    except CatalogError as exc:
        return str(exc)
    return ""


# --- a catalog that cannot render ---------------------------------------------------------------


def test_an_unknown_filter_is_refused_at_load_naming_file_type_version_channel_and_field(tmp_path):
    path = write(tmp_path, WEEKLY)
    with pytest.raises(
        CatalogError,
        match=r"type 'weekly_one_on_one' v2 channel 'teams' field 'body': unknown filter 'shout'$",
    ) as caught:
        Catalog.from_yaml(path)
    assert str(caught.value) == (
        f"{path}: type 'weekly_one_on_one' v2 channel 'teams' field 'body': unknown filter 'shout'"
    )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("{{ ''.__class__.__mro__ }}", "refused by the sandbox"),
        ("{{ name.__init__ }}", "refused by the sandbox"),
        ("{{ name is shouty }}", "unknown test 'shouty'"),
        (
            "{% for i in range(100000) %}{{ 'xy' }}{% endfor %}",
            f"more than {MAX_OUTPUT} characters",
        ),
        ("{{ 'x' * 1000000000 }}", "repeating a text or list"),
        ("{{ [1] * 1000000000 }}", "repeating a text or list"),
        ("{{ 2 ** 100000000 }}", "exponent"),
        ("{{ 1 / 0 }}", "cannot render: ZeroDivisionError"),
        # stopped by depth, not by Python's RecursionError or the time limit (a loaded machine)
        ("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "calls nest deeper than 64"),
        (
            "{{ name + 1 }}",
            "cannot render: TypeError",
        ),  # a sample of the wrong kind: declare samples
        ("{{ range(1000000) }}", "Range too big"),
    ],
)
def test_templates_that_cannot_render_are_refused_at_load(body: str, problem: str) -> None:
    message = one_type(templates=[{"version": 1, "body": body}])
    assert message.startswith("here.yaml: type 't' v1 channel 'webhook' field 'body': "), message
    assert problem in message


def test_a_runaway_loop_is_stopped_by_the_time_limit() -> None:
    started = time.monotonic()
    body = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    message = one_type(templates=[{"version": 1, "body": body}])
    assert "rendering took longer than 1 s" in message
    assert time.monotonic() - started < 5


def test_every_channel_and_every_version_is_rendered() -> None:
    message = one_type(
        channels=["webhook", "console"],
        templates=[
            {"version": 1, "body": "Hi {{ name }}"},
            {
                "version": 2,
                "body": "Hi {{ name }}",
                "channels": {"console": {"title": "{{ name | nope }}"}},
            },
        ],
    )
    assert "type 't' v2 channel 'console' field 'title': unknown filter 'nope'" in message


def test_a_collapse_key_that_cannot_render_is_refused() -> None:
    message = one_type(options={"collapse": {"key": "{{ name | nope }}", "window_seconds": 60}})
    assert "options.collapse.key: unknown filter 'nope'" in message


# --- samples --------------------------------------------------------------------------------------


def test_declared_samples_make_a_typed_template_load() -> None:
    body = "{{ count + 1 }} new, latest {{ items[0].title }}"
    assert "TypeError" in one_type(
        required=["count", "items"], templates=[{"version": 1, "body": body}]
    )
    assert (
        one_type(
            required=["count", "items"],
            samples={"count": 3, "items": [{"title": "A"}]},
            templates=[{"version": 1, "body": body}],
        )
        == ""
    )
    per_version = [{"version": 1, "body": body, "samples": {"count": 1, "items": [{"title": "B"}]}}]
    assert one_type(required=["count", "items"], templates=per_version) == ""


def test_without_samples_required_variables_render_as_flexible_stand_ins() -> None:
    body = "{{ user.name }} {{ user['id'] }} {% for i in items %}{{ i.title | upper }}{% endfor %} {{ f() }}"
    assert one_type(required=["user", "items", "f"], templates=[{"version": 1, "body": body}]) == ""


def test_sample_variables_prefer_version_then_type_samples_over_defaults() -> None:
    ntype = Catalog.from_dict(
        {
            "types": {
                "t": {
                    "category": "alert",
                    "channels": ["console"],
                    "required": ["a"],
                    "defaults": {"b": 1, "c": 1},
                    "samples": {"b": 2},
                    "templates": [
                        {"version": 1, "body": "{{ a }}{{ b }}{{ c }}", "samples": {"c": 3}}
                    ],
                }
            }
        }
    ).types["t"]
    assert ntype.sample_variables(1) == {"a": "a", "b": 2, "c": 3}
    assert ntype.render(1, "console", {"a": "x"}) == {
        "body": "x11"
    }  # samples never reach a delivery


@pytest.mark.parametrize("samples", [["a"], "a", {1: "x"}])
def test_samples_must_be_a_mapping_of_names(samples: object) -> None:
    assert "samples must map variable names" in one_type(samples=samples)


# --- channel names --------------------------------------------------------------------------------


def test_a_channel_typo_is_refused_at_load_with_a_suggestion(tmp_path):
    path = write(
        tmp_path, WEEKLY.replace("[slack, teams]", "[slack, webhok]").replace("| shout", "")
    )
    with pytest.raises(
        CatalogError, match=r"channels: unknown channel 'webhok'; did you mean 'webhook'\?$"
    ) as caught:
        Catalog.from_yaml(path)
    assert str(caught.value) == (
        f"{path}: type 'weekly_one_on_one': channels: unknown channel 'webhok'; "
        "did you mean 'webhook'?"
    )


def test_a_per_channel_override_typo_is_refused() -> None:
    message = one_type(templates=[{"version": 1, "body": "x", "channels": {"slak": {"body": "y"}}}])
    assert "template v1 channels: unknown channel 'slak'; did you mean 'slack'?" in message


def test_an_unknown_channel_without_a_close_match_lists_the_known_ones() -> None:
    assert f"known: {', '.join(sorted(CHANNELS))}" in one_type(channels=["pigeon"])


def test_every_known_channel_is_accepted() -> None:
    assert one_type(channels=sorted(CHANNELS)) == ""


# --- YAML -----------------------------------------------------------------------------------------

KEYS = """\
types:
  no:
    category: alert
    channels: [console]
    one_platform: yes
    options: {default: off}
    templates: [{version: 1, body: "no"}]
  on:
    category: alert
    channels: [console]
    templates: [{version: 1, body: "on"}]
  1:
    category: alert
    channels: [console]
    templates: [{version: 1, body: "one", channels: {console: {on: "x"}}}]
  null:
    category: alert
    channels: [console]
    templates: [{version: 1, body: "null", 2: two}]
"""


def test_yaml_keys_stay_the_text_written(tmp_path):
    catalog = Catalog.from_yaml(write(tmp_path, KEYS))
    assert list(catalog.types) == ["no", "on", "1", "null"]
    assert catalog.get("no").options == {"default": "off"}  # YAML 1.2: off is text ...
    assert catalog.get("no").default_on is False  # ... and still means off
    assert catalog.get("1").templates[1].per_channel == {"console": {"on": "x"}}
    assert catalog.get("null").templates[1].fields == {"body": "null", "2": "two"}


def test_true_and_false_are_still_booleans(tmp_path):
    text = KEYS.replace("one_platform: yes", "one_platform: true")
    assert Catalog.from_yaml(write(tmp_path, text)).get("no").one_platform is True


def test_a_key_given_twice_is_refused(tmp_path):
    text = KEYS + "  on:\n    category: alert\n"
    with pytest.raises(CatalogError, match="key 'on' is given twice"):
        Catalog.from_yaml(write(tmp_path, text))


def test_a_non_text_key_is_refused(tmp_path):
    with pytest.raises(CatalogError, match="a mapping key must be text"):
        Catalog.from_yaml(write(tmp_path, "types:\n  [a, b]: {}\n"))


def test_a_file_that_is_not_utf8_is_a_catalog_error(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_bytes(b"types:\n  t: \xff\n")
    with pytest.raises(CatalogError, match="cannot read catalog"):
        Catalog.from_yaml(path)


# --- render limits at delivery --------------------------------------------------------------------


def test_delivery_renders_are_capped_too() -> None:
    ntype = Catalog.from_dict(
        {
            "types": {
                "t": {
                    "category": "alert",
                    "channels": ["console"],
                    "required": ["items"],
                    "templates": [
                        {"version": 1, "body": "{% for i in items %}{{ i }}{% endfor %}"}
                    ],
                }
            }
        }
    ).types["t"]
    assert ntype.render(1, "console", {"items": ["ab"] * 10}) == {"body": "ab" * 10}
    with pytest.raises(RenderLimitExceeded, match=r"^renders to more than 100000 characters$"):
        ntype.render(1, "console", {"items": ["x" * 1000] * 101})
    assert issubclass(RenderLimitExceeded, SecurityError)


# --- a worker's start-up check --------------------------------------------------------------------


@pytest.fixture
def configured(monkeypatch):
    def use(value: str) -> None:
        monkeypatch.setenv("CLARION_CATALOG", value)
        settings.reset()
        runtime.reset()

    yield use
    settings.reset()
    runtime.reset()


def test_check_catalog_refuses_a_catalog_that_cannot_render(configured, tmp_path):
    path = write(tmp_path, WEEKLY)
    configured(str(path))
    with pytest.raises(
        ConfigurationError, match=r"field 'body': unknown filter 'shout'$"
    ) as caught:
        runtime.check_catalog()
    assert (
        "type 'weekly_one_on_one' v2 channel 'teams' field 'body': unknown filter 'shout'"
        in str(caught.value)
    )
    assert str(path) in str(caught.value)


def test_check_catalog_refuses_a_channel_typo(configured, tmp_path):
    configured(
        str(write(tmp_path, WEEKLY.replace("slack, teams", "slack, teems").replace("| shout", "")))
    )
    with pytest.raises(ConfigurationError, match="unknown channel 'teems'; did you mean 'teams'"):
        runtime.check_catalog()


def test_check_catalog_passes_a_good_catalog_and_checks_python_built_ones(configured, monkeypatch):
    configured(str(write_good := Path(__file__).parents[1] / "catalog.yaml"))
    assert set(runtime.check_catalog().types) == set(Catalog.from_yaml(write_good).types)
    bad = Catalog(
        {
            "t": NotificationType(
                "t",
                "alert",
                "transactional",
                ("console",),
                {1: Template(1, {"body": "{{ x | nope }}"})},
            )
        },
        source="mod:CAT",
    )
    import sys
    import types

    module = types.ModuleType("clarion_bad_catalog")
    module.CAT = bad
    monkeypatch.setitem(sys.modules, module.__name__, module)
    configured("clarion_bad_catalog:CAT")
    with pytest.raises(
        ConfigurationError,
        match="mod:CAT: type 't' v1 channel 'console' field 'body': unknown filter",
    ):
        runtime.check_catalog()
