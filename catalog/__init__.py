"""The catalog: notification types, categories, versioned templates. Imports nothing of ours."""

from clarion.catalog.model import (
    CATEGORIES,
    Button,
    Catalog,
    CatalogError,
    NotificationType,
    Strings,
    Template,
)

__all__ = [
    "CATEGORIES",
    "Button",
    "Catalog",
    "CatalogError",
    "NotificationType",
    "Strings",
    "Template",
]
