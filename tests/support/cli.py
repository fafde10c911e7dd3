"""How a `clarion` command's result should look, for tests that run the CLI as a subprocess:
`ok` (exit 0, no traceback: its stdout) and `refused` (exit 2 and one `clarion: ...` line)."""

from __future__ import annotations

import subprocess


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess) -> str:
    """A bad call: exit 2, nothing on stdout, one line `clarion: ...` on stderr, no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("clarion: "), result.stderr
    return lines[0]
