"""slack endpoints (to be built)."""


def routes() -> list:
    return []
