"""catalog/model.py: load-time validation, lanes, versions, rendering in the sandbox."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from jinja2.exceptions import SecurityError, UndefinedError

from clarion.catalog import CATEGORIES, Catalog, CatalogError
from clarion.catalog.model import DEFAULT_LANE, EXAMPLES

TESTS = Path(__file__).resolve().parents[1]


def spec(**overrides: Any) -> dict[str, Any]:
    """A valid type spec; keyword arguments replace (or, with None, remove) its keys."""
    base: dict[str, Any] = {
        "category": "transactional",
        "channels": ["webhook"],
        "required": ["name"],
        "templates": [{"version": 1, "body": "Hi {{ name }}"}],
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def one(type_spec: dict[str, Any], key: str = "t"):
    return Catalog.from_dict({"types": {key: type_spec}}).get(key)


# --- validation errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_spec", "message"),
    [
        (spec(category="newsletter"), "category must be one of"),
        (spec(category=None), "not None"),
        (spec(lane="bulk"), "lane must be one of"),
        (spec(lane="control"), "lane must be one of"),
        (spec(channels=[]), "needs at least one channel"),
        (spec(channels=None), "needs at least one channel"),
        (spec(templates=[]), "needs a list of templates"),
        (spec(templates=None), "needs a list of templates"),
        (spec(templates=[{"body": "Hi {{ name }}"}]), "integer version"),
        (spec(templates=[{"version": "one", "body": "x"}]), "integer version"),
        (spec(templates=[{"version": None, "body": "x"}]), "integer version"),
        (spec(templates=[{"version": 1, "body": "Hi {{ nam }}"}]), "uses nam, which are neither"),
        (
            spec(
                templates=[
                    {"version": 1, "body": "{{ name }}", "channels": {"sms": {"body": "{{ x }}"}}}
                ]
            ),
            "uses x, which are neither",
        ),
        (
            spec(
                templates=[
                    {"version": 1, "body": "{{ name }}"},
                    {"version": 2, "body": "{{ extra }}"},
                ]
            ),
            "template v2 uses extra",
        ),
        (
            spec(templates=[{"version": 1, "body": "Hi {{ name "}]),
            "v1 channel 'webhook' field 'body':",
        ),
        (
            spec(templates=[{"version": 1, "body": "{% if name %}open"}]),
            "v1 channel 'webhook' field 'body':",
        ),
        (
            spec(templates=[{"version": 1, "body": "{{ name | }}"}]),
            "v1 channel 'webhook' field 'body':",
        ),
    ],
)
def test_invalid_type_is_rejected_at_load(type_spec: dict[str, Any], message: str) -> None:
    with pytest.raises(CatalogError, match=r"type 't'[: ]") as caught:
        Catalog.from_dict({"types": {"t": type_spec}})
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "data", [{}, {"types": {}}, {"types": None}, {"types": ["a"]}, {"other": 1}]
)
def test_catalog_needs_a_types_mapping(data: dict[str, Any]) -> None:
    with pytest.raises(CatalogError, match="non-empty 'types' mapping"):
        Catalog.from_dict(data, source="here.yaml")


def test_undeclared_variable_error_lists_every_name_sorted() -> None:
    with pytest.raises(CatalogError, match=r"uses a, b, zed, which"):
        one(spec(required=[], templates=[{"version": 1, "body": "{{ zed }}{{ b }}{{ a }}"}]))


@pytest.mark.parametrize(
    ("body", "required", "defaults"),
    [
        ("{{ name }}", ["name"], {}),
        ("{{ name }}", [], {"name": "you"}),
        ("{{ name }} {{ days }}", ["name"], {"days": 7}),
        ("{% set x = 1 %}{{ x }}", [], {}),  # template-local names are not variables
        ("{% for i in items %}{{ i }}{% endfor %}", ["items"], {}),
        ("{{ user.name }}", ["user"], {}),
        ("no variables at all", [], {}),
    ],
)
def test_declared_variables_are_accepted(body: str, required: list[str], defaults: dict) -> None:
    ntype = one(
        spec(required=required, defaults=defaults, templates=[{"version": 1, "body": body}])
    )
    assert ntype.templates[1].fields == {"body": body}


# --- yaml ---------------------------------------------------------------------------------------


def test_from_yaml_reports_the_path(tmp_path: Path) -> None:
    path = tmp_path / "cat.yaml"
    path.write_text("types:\n  t:\n    category: nope\n")
    with pytest.raises(CatalogError, match="category must be one of"):
        Catalog.from_yaml(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "non-empty 'types' mapping"),
        ("types: {}\n", "non-empty 'types' mapping"),
        ("types: [\n", "cannot read catalog"),
        ("types:\n  t: {category: alert\n", "cannot read catalog"),
    ],
)
def test_from_yaml_rejects_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "cat.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message) as caught:
        Catalog.from_yaml(path)
    assert str(path) in str(caught.value)


def test_from_yaml_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read catalog"):
        Catalog.from_yaml(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("path", "keys"),
    [
        (
            EXAMPLES / "demo.yaml",
            {
                "order_receipt",
                "password_reset",
                "plan_kickoff",
                "stalled_plan",
                "weekly_one_on_one",
                "daily_summary",
                "goal_prompt",
                "order_shipped",
                "login_code",
                "order_delayed",
                "oncall_page",
                "oncall_sms",
                "oncall_secondary",
                "seller_replied",
                "replies_digest",
            },
        ),
        (TESTS / "catalog.yaml", {"receipt", "security_code", "nudge", "two_channels", "emailed"}),
    ],
)
def test_shipped_catalogs_load(path: Path, keys: set[str]) -> None:
    catalog = Catalog.from_yaml(path)
    assert set(catalog.types) == keys
    assert catalog.source == str(path)
    for ntype in catalog.types.values():
        assert ntype.category in CATEGORIES
        assert ntype.lane == DEFAULT_LANE[ntype.category]
        # text for every required variable, but a digest's items as its declared samples
        variables = {**{name: f"<{name}>" for name in ntype.required}, **ntype.samples}
        for channel in ntype.channels:
            rendered = ntype.render(ntype.version, channel, variables)
            assert rendered and all(isinstance(v, str) for v in rendered.values())


def test_demo_catalog_contents() -> None:
    catalog = Catalog.from_yaml(EXAMPLES / "demo.yaml")
    assert catalog.types["order_receipt"].version == 2
    assert catalog.types["plan_kickoff"].one_platform is True
    assert catalog.types["order_receipt"].one_platform is False
    assert catalog.types["stalled_plan"].render(1, "webhook", {"first_name": "Ada"}) == {
        "title": "Still with us, Ada?",
        "body": "Your plan has been quiet for 7 days. Ten minutes today keeps it moving.",
    }
    assert catalog.channels == frozenset({"webhook", "console", "slack", "email", "sms", "push"})
    assert catalog.get("nope") is None


# --- lanes, versions, missing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("category", "lane"),
    [
        ("transactional", "transactional"),
        ("security", "transactional"),
        ("alert", "transactional"),
        ("activation", "activation"),
        ("digest", "activation"),
        ("marketing", "activation"),
    ],
)
def test_lane_defaults_per_category(category: str, lane: str) -> None:
    assert one(spec(category=category)).lane == lane


@pytest.mark.parametrize(
    ("category", "lane"), [("marketing", "transactional"), ("alert", "activation")]
)
def test_explicit_lane_overrides_the_default(category: str, lane: str) -> None:
    assert one(spec(category=category, lane=lane)).lane == lane


def test_every_category_has_a_default_lane() -> None:
    assert set(DEFAULT_LANE) == set(CATEGORIES)


@pytest.mark.parametrize(
    ("versions", "latest"),
    [([1], 1), ([1, 2], 2), ([3, 1, 2], 3), ([2, 10], 10)],
)
def test_version_is_the_highest(versions: list, latest: int) -> None:
    ntype = one(spec(templates=[{"version": v, "body": f"v{v} {{{{ name }}}}"} for v in versions]))
    assert ntype.version == latest
    assert ntype.render(latest, "webhook", {"name": "x"}) == {"body": f"v{latest} x"}


@pytest.mark.parametrize(
    ("required", "variables", "missing"),
    [
        (["name"], {"name": "A"}, []),
        (["name"], {}, ["name"]),
        (["a", "b", "c"], {"b": 1}, ["a", "c"]),
        (["a"], {"a": None}, []),  # present, even if null
        ([], {"x": 1}, []),
    ],
)
def test_missing(required: list[str], variables: dict, missing: list[str]) -> None:
    body = " ".join(f"{{{{ {n} }}}}" for n in required) or "static"
    ntype = one(spec(required=required, templates=[{"version": 1, "body": body}]))
    assert ntype.missing(variables) == missing


def test_one_platform_config_and_options_are_kept() -> None:
    ntype = one(
        spec(
            one_platform=True,
            config={"webhook": {"url": "http://x"}},
            options={"window_exempt": True, "on_window": "defer"},
        )
    )
    assert ntype.one_platform is True
    assert ntype.config == {"webhook": {"url": "http://x"}}
    assert ntype.options == {"window_exempt": True, "on_window": "defer"}
    assert ntype.window_exempt
    assert ntype.channels == ("webhook",)


# --- render -------------------------------------------------------------------------------------

OVERRIDES = spec(
    channels=["webhook", "sms", "console"],
    required=["name"],
    defaults={"days": 7, "sign": "clarion"},
    templates=[
        {"version": 1, "title": "old {{ name }}", "body": "old body"},
        {
            "version": 2,
            "title": "Hi {{ name }}",
            "body": "Quiet for {{ days }} days. {{ sign }}",
            "channels": {
                "sms": {"body": "{{ name }}: {{ days }}d"},
                "console": {"footer": "-- {{ sign }}"},
            },
        },
    ],
)


@pytest.mark.parametrize(
    ("version", "channel", "variables", "expected"),
    [
        (2, "webhook", {"name": "Ada"}, {"title": "Hi Ada", "body": "Quiet for 7 days. clarion"}),
        (2, "sms", {"name": "Ada"}, {"title": "Hi Ada", "body": "Ada: 7d"}),
        (2, "sms", {"name": "Ada", "days": 3}, {"title": "Hi Ada", "body": "Ada: 3d"}),
        (
            2,
            "console",
            {"name": "Ada", "sign": "ops"},
            {"title": "Hi Ada", "body": "Quiet for 7 days. ops", "footer": "-- ops"},
        ),
        (2, "push", {"name": "Ada"}, {"title": "Hi Ada", "body": "Quiet for 7 days. clarion"}),
        (1, "sms", {"name": "Ada"}, {"title": "old Ada", "body": "old body"}),  # pinned version
    ],
)
def test_render(version: int, channel: str, variables: dict, expected: dict) -> None:
    assert one(OVERRIDES).render(version, channel, variables) == expected


def test_render_does_not_autoescape() -> None:
    ntype = one(spec())
    assert ntype.render(1, "webhook", {"name": "<b>&"}) == {"body": "Hi <b>&"}


def test_render_unknown_version_raises() -> None:
    with pytest.raises(KeyError, match="^9$"):  # the version asked for, not some other key
        one(spec()).render(9, "webhook", {"name": "x"})


@pytest.mark.parametrize(
    ("body", "variables", "missing"),
    [
        ("Hi {{ name }}", {}, "'name' is undefined"),
        ("Hi {{ name.first }}", {"name": {}}, "'dict object' has no attribute 'first'"),
        ("Hi {{ name | upper }}", {}, "'name' is undefined"),
        ("{% if name %}yes{% endif %}", {}, "'name' is undefined"),
        ("{{ name ~ '!' }}", {}, "'name' is undefined"),
    ],
)
def test_strict_undefined_raises_instead_of_rendering_blank(
    body: str, variables: dict, missing: str
) -> None:
    ntype = one(spec(templates=[{"version": 1, "body": body}]))
    with pytest.raises(UndefinedError, match=f"^{re.escape(missing)}$"):
        ntype.render(1, "webhook", variables)


@pytest.mark.parametrize(
    "body",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ name.__class__.__base__.__subclasses__() }}",
        "{{ name.__init__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ range.__init__ }}",
        "{{ name.__len__() }}",
        "{{ name['__class__'] }}",
        "{{ name | attr('__class__') }}",
    ],
)
def test_sandbox_refuses_unsafe_attributes(body: str) -> None:
    # Refused at load: the load-time check renders every field in the delivery sandbox.
    with pytest.raises(
        CatalogError, match="field 'body': refused by the sandbox: .*unsafe"
    ) as caught:
        one(spec(templates=[{"version": 1, "body": body}]))
    assert isinstance(caught.value.__cause__, SecurityError)


@pytest.mark.parametrize("body", ["{{ name.upper.__globals__ }}", "{{ ''.format.__self__ }}"])
def test_dunders_that_do_not_exist_fail_strictly(body: str) -> None:
    # Builtin methods have no __globals__/__self__ visible here: StrictUndefined, not blank text.
    with pytest.raises(CatalogError, match="field 'body'") as caught:
        one(spec(templates=[{"version": 1, "body": body}]))
    assert isinstance(caught.value.__cause__, UndefinedError)


def test_sandbox_allows_plain_methods_but_not_format_escapes() -> None:
    ntype = one(spec(templates=[{"version": 1, "body": "{{ name.mro() }}"}]))

    class Evil:
        def mro(self) -> str:  # an ordinary method is callable, its dunder relatives are not
            return "called"

    assert ntype.render(1, "webhook", {"name": Evil()}) == {"body": "called"}
    with pytest.raises(CatalogError, match="refused by the sandbox") as caught:
        one(spec(templates=[{"version": 1, "body": "{{ '{0.__class__}'.format(name) }}"}]))
    assert isinstance(caught.value.__cause__, SecurityError)


# --- malformed shapes (once known gaps) ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [("channels", "webhook"), ("required", "code")])
def test_a_string_instead_of_a_list_is_refused_not_split_into_characters(
    key: str, value: str
) -> None:
    type_spec = spec(required=[], templates=[{"version": 1, "body": "static"}])
    type_spec[key] = value
    with pytest.raises(CatalogError, match=f"{key} must be a list of names, not '{value}'"):
        one(type_spec)


TYPE = "types:\n  t:\n    category: alert\n    channels: [webhook]\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("- a\n- b\n", "needs a non-empty 'types' mapping", id="top-level-list"),
        pytest.param("just a string\n", "needs a non-empty 'types' mapping", id="top-level-scalar"),
        pytest.param("types:\n  t: [a, b]\n", "must be a mapping, not", id="type-is-list"),
        pytest.param("types:\n  t: 5\n", "must be a mapping, not 5", id="type-is-int"),
        pytest.param(
            TYPE + "    templates: [hello]\n",
            "a template must be a mapping, not 'hello'",
            id="template-is-string",
        ),
        pytest.param(
            TYPE + "    templates: {version: 1, body: hi}\n",
            "needs a list of templates",
            id="templates-is-mapping",
        ),
        pytest.param(
            TYPE + "    templates:\n      - {version: 1, body: hi, channels: [webhook]}\n",
            "channels must map a channel to its fields",
            id="per-channel-is-list",
        ),
        pytest.param(
            TYPE + "    templates:\n      - version: 1\n        title:\n        body: hi\n",
            "template v1.title must be text, not None",  # never rendered as "None"
            id="null-field",
        ),
    ],
)
def test_malformed_shapes_are_refused_naming_the_shape(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "cat.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=re.escape(problem)):
        Catalog.from_yaml(path)


def test_a_number_in_a_per_channel_field_renders_as_a_top_level_one_would() -> None:
    type_spec = spec(
        required=[], templates=[{"version": 1, "body": "hi", "channels": {"sms": {"body": 5}}}]
    )
    assert one(type_spec).render(1, "sms", {}) == {"body": "5"}


def test_duplicate_template_version_is_rejected() -> None:
    with pytest.raises(CatalogError, match="type 't': template version 1 is defined twice"):
        one(
            spec(
                templates=[
                    {"version": 1, "body": "first {{ name }}"},
                    {"version": 1, "body": "second"},
                ]
            )
        )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cap": 3}, "unknown options"),
        ({"on_window": "later"}, "on_window"),
        ({"default": "maybe"}, "options.default"),
        ({"collapse": {"window_seconds": 5}}, "collapse needs a key"),
        ({"collapse": {"key": "{{ nope }}"}}, "collapse.key may only use"),
    ],
)
def test_bad_type_options_are_rejected(options: dict, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        one(spec(options=options))


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("nope", "policy must be a mapping"),
        ({"fatigue": {"per_user_per_day": 0}}, "positive integers"),
        ({"fatigue": {"summary_type": "ghost"}}, "not a type"),
        ({"quiet_hours_bypass": ["vip"]}, "unknown categories"),
    ],
)
def test_bad_policy_is_rejected(policy: object, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        Catalog.from_dict({"types": {"t": spec()}, "policy": policy})
