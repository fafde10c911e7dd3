"""catalog.sandbox's Substitution (templates that are only text and `{{ name }}`) renders exactly
what Jinja renders for the same source and context, errors included; anything else stays Jinja."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import Template

from clarion.catalog.sandbox import (
    MAX_OUTPUT,
    RenderLimitExceeded,
    Substitution,
    compile_template,
    env,
    render,
)

NAMES = ["order", "name", "n", "range", "self", "loop", "missing"]
text = st.text(st.characters(exclude_characters="{}%#"), max_size=12)
piece = st.one_of(
    text,
    st.builds(
        lambda name, left, right: "{{" + left + " " + name + " " + right + "}}",
        st.sampled_from(NAMES),
        st.sampled_from(["", "-"]),
        st.sampled_from(["", "-"]),
    ),
)
values = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
contexts = st.dictionaries(st.sampled_from(NAMES[:4]), values)


def _outcome(template: Template | Substitution, context: dict) -> tuple[str, str]:
    try:
        return "ok", render(template, context)
    except Exception as exc:  # the same error, type and words, either way
        return type(exc).__name__, str(exc)


@settings(max_examples=300, deadline=None, derandomize=True)  # compiling is slow under load
@given(st.lists(piece, max_size=6).map("".join), st.sampled_from(["", "\n", "\n\n"]), contexts)
def test_a_substitution_renders_what_jinja_renders(body: str, tail: str, context: dict) -> None:
    source = body + tail
    assert _outcome(compile_template(source), context) == _outcome(env.from_string(source), context)


@pytest.mark.parametrize(
    "source", ["Receipt {{ order }}", "plain text", "", "{{- name }} and\n{{ n -}}  !\n"]
)
def test_text_and_names_are_a_substitution(source: str) -> None:
    assert isinstance(compile_template(source), Substitution)


@pytest.mark.parametrize(
    "source",
    [
        "{{ order | upper }}",
        "{{ user.name }}",
        "{{ items[0] }}",
        "{% if n %}x{% endif %}",
        "{{ n * 2 }}",
        "{{ 'lit' }}",
        "{# c #}{{ n }}{{ f() }}",
        "{{ self }}",
    ],
)
def test_anything_more_stays_jinja(source: str) -> None:
    assert not isinstance(compile_template(source), Substitution)


def test_a_substitution_keeps_the_output_cap() -> None:
    with pytest.raises(RenderLimitExceeded, match="more than"):
        render(compile_template("{{ n }}{{ n }}"), {"n": "x" * (MAX_OUTPUT // 2 + 1)})
