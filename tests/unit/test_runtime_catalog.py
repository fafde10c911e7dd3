"""CLARION_CATALOG names a YAML file or a Python object."""

from __future__ import annotations

import sys
import types

import pytest

from clarion import settings
from clarion.catalog import Catalog
from clarion.errors import ConfigurationError
from clarion.tasks import runtime

SPEC = {
    "types": {
        "hello": {
            "category": "transactional",
            "channels": ["console"],
            "templates": [{"version": 1, "body": "hi"}],
        }
    }
}


@pytest.fixture
def catalog_from(monkeypatch):
    module = types.ModuleType("clarion_test_catalogs")
    module.AS_DICT = SPEC
    module.AS_CATALOG = Catalog.from_dict(SPEC)
    module.NEITHER = 42
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def load(value: str) -> Catalog:
        monkeypatch.setenv("CLARION_CATALOG", value)
        settings.reset()
        runtime.reset()
        return runtime.catalog()

    yield load
    settings.reset()
    runtime.reset()


@pytest.mark.parametrize("name", ["AS_DICT", "AS_CATALOG"])
def test_a_python_catalog_loads(catalog_from, name):
    assert set(catalog_from(f"clarion_test_catalogs:{name}").types) == {"hello"}


@pytest.mark.parametrize(
    "value",
    ["clarion_test_catalogs:NEITHER", "clarion_test_catalogs:MISSING", "no_such_module_x:CATALOG"],
)
def test_a_bad_python_catalog_is_a_configuration_error(catalog_from, value):
    with pytest.raises(ConfigurationError, match="CLARION_CATALOG"):
        catalog_from(value)
