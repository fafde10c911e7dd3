"""catalog/options.py: a type's gate options carry their defaults from the moment it is built."""

from __future__ import annotations

from clarion.catalog import Catalog
from clarion.catalog.options import (
    DEFAULT_UPDATE_SECONDS,
    DEFAULT_WINDOW_SECONDS,
    CollapseOptions,
    GateOptions,
)


def _catalog(**options: object) -> Catalog:
    body = {"category": "alert", "channels": ["email"], "required": ["thread"]}
    spec = {**body, "templates": [{"version": 1, "body": "hi"}], "options": options}
    return Catalog.from_dict({"types": {"t": spec}})


def test_a_type_that_says_nothing_gets_every_default() -> None:
    ntype = _catalog().get("t")
    assert ntype is not None
    assert ntype.gate_options == GateOptions()
    assert ntype.gate_options.on_window == "skip"


def test_a_collapse_without_spacings_gets_both_defaults() -> None:
    ntype = _catalog(collapse={"key": "{{ thread }}"}, on_window="defer").get("t")
    assert ntype is not None
    assert ntype.gate_options.collapse == CollapseOptions(
        "{{ thread }}", DEFAULT_WINDOW_SECONDS, DEFAULT_UPDATE_SECONDS
    )
    assert ntype.gate_options.on_window == "defer"
    assert ntype.collapse_update_seconds == DEFAULT_UPDATE_SECONDS


def test_given_values_win_over_the_defaults() -> None:
    spec = {"key": "{{ thread }}", "window_seconds": 300, "update_seconds": 2}
    ntype = _catalog(collapse=spec, critical=True, default="off").get("t")
    assert ntype is not None
    assert ntype.gate_options.collapse == CollapseOptions("{{ thread }}", 300.0, 2.0)
    assert ntype.critical and ntype.default_on is False
