"""A statement of db/ (named `:parameters`) as PREPARE takes it, for tests that look at the plan a
prepared statement settles on (tests/integration/test_history_plans.py, test_statistics.py)."""

from __future__ import annotations

import re


def numbered(sql: str) -> tuple[str, list[str]]:
    """`sql` with each `:name` replaced by `$n` (one number per name, in order of first use), and
    the names in that order (`::type` casts are left alone)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"(?<!:):([a-z_]+)", number, sql), names
