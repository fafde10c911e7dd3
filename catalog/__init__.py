"""The catalog: notification types, categories, versioned templates. Imports nothing of ours."""

from clarion.catalog.model import (
    CATEGORIES,
    RECIPIENT_CHANNELS,
    Button,
    Catalog,
    CatalogError,
    NotificationType,
    Strings,
    Template,
)

__all__ = [
    "RECIPIENT_CHANNELS",
    "CATEGORIES",
    "Button",
    "Catalog",
    "CatalogError",
    "NotificationType",
    "Strings",
    "Template",
]
