"""Build clarion's wheel and install it into fresh virtualenvs outside the source tree.

Used by tests/acceptance/test_package.py; a host-app test reuses the same pieces: `build_wheel`
once per session, `Venv.create` + `Venv.install` per interpreter or set of extras, `Venv.run` to
run commands in the venv (its bin/ first on PATH, no CLARION_* or TEST_* variables inherited)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
# pyenv's shim on PATH may refuse to run 3.13 (not the global version): the interpreter itself first
PYTHON_313_CANDIDATES = ("/root/.pyenv/versions/3.13.0/bin/python3.13", shutil.which("python3.13"))
INSTALL_TIMEOUT = 900  # seconds: pip on a busy two-core machine


def _run(command: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, command))} exited {result.returncode}\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def python_313() -> str:
    """A Python 3.13 interpreter that runs (AssertionError naming where it looked, if none)."""
    for candidate in filter(None, PYTHON_313_CANDIDATES):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 13)":
            return candidate
    raise AssertionError(f"no Python 3.13 runs here; looked at {PYTHON_313_CANDIDATES}")


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


def build(out: Path) -> Built:
    """`python -m build`: the sdist from the source tree, then the wheel from that sdist."""
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], timeout=600)
    [sdist] = out.glob("clarion-*.tar.gz")
    [wheel] = out.glob("clarion-*.whl")
    return Built(sdist, wheel)


def top_level_names(wheel: Path) -> list[str]:
    """The names the wheel puts into site-packages (the first part of every path it holds)."""
    with zipfile.ZipFile(wheel) as archive:
        return sorted({name.split("/", 1)[0] for name in archive.namelist()})


def wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


@dataclass(frozen=True)
class Venv:
    path: Path

    @classmethod
    def create(cls, path: Path, python: str = sys.executable) -> Venv:
        assert not path.resolve().is_relative_to(ROOT), f"{path} is inside the source tree"
        _run([python, "-m", "venv", str(path)], timeout=300)
        return cls(path)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def env(self, **values: str) -> dict[str, str]:
        """This process's environment without clarion's or the tests' settings, the venv first."""
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CLARION_", "TEST_CLARION_", "CELERY_", "VIRTUAL_ENV", "PYTHON"))
        }
        keep["PATH"] = f"{self.path / 'bin'}{os.pathsep}{keep.get('PATH', '')}"
        return {**keep, **values}

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.python), "-m", "pip", *args, timeout=INSTALL_TIMEOUT)

    def install(
        self, wheel: Path, extras: tuple[str, ...] = (), *more: str, lock: Path | None = LOCK
    ) -> None:
        """pip install the wheel (with `extras`) and `more` requirements, pinned by `lock`."""
        target = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
        constraints = ["-c", str(lock)] if lock is not None else []
        self.pip("install", "--quiet", *constraints, target, *more)

    def run(
        self, *command: str, timeout: float = 120, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` in the venv (from `cwd`, default the venv folder); raise unless it exits 0."""
        return _run(list(command), timeout=timeout, cwd=cwd or self.path, env=self.env(**env))

    def attempt(
        self, *command: str, timeout: float = 120, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` in the venv and return whatever it exits with."""
        return subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.path,
            env=self.env(**env),
        )


# Imports what each production process imports (the worker's and beat's Celery app with every task
# module, the web app as `clarion web` builds it, notify(), the clarion command) and prints the
# loaded module names as JSON.
ENTRY_POINTS = """
import json, sys
import clarion.ops.cli
from clarion.celery import app
app.loader.import_default_modules()
from clarion.web.app import create_app
create_app()
from clarion import notify
print(json.dumps(sorted(sys.modules)))
"""
