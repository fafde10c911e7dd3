"""`clarion keys create --help` names every API scope there is, and nothing else (the CLI reference
in the docs is generated from this parser)."""

from __future__ import annotations

import re

from clarion.ops.cli import parser
from clarion.web.api_auth import SCOPES


def test_the_scope_help_lists_exactly_the_scopes():
    keys = parser()._subparsers._group_actions[0].choices["keys"]
    create = keys._subparsers._group_actions[0].choices["create"]
    [scope] = [a for a in create._actions if "--scope" in a.option_strings]
    assert sorted(re.findall(r"[a-z]+:[a-z]+", scope.help)) == sorted(SCOPES)
