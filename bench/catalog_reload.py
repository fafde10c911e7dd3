"""What looking for catalog edits costs a task (tasks/catalogs.py), against a cached catalog read.

    cd /work/wt-catalog && .venv/bin/python bench/catalog_reload.py [--calls 1000000]

  cached    the catalog as a plain attribute read (what a process without reload would pay)
  current   Loaded.current() between looks: one monotonic clock read and a comparison
  look      Loaded.check_now() on an unchanged file: one os.stat (paid at most once a second)
  reload    check_now() after an edit: read, sha256, build and check the demo catalog

Prints nanoseconds per call and the ratio of `current` to `cached`. No services needed.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from clarion.catalog.model import EXAMPLES
from clarion.tasks.catalogs import Loaded


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Nanoseconds per call of `fn`, best of three runs."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "catalog.yaml"
        shutil.copyfile(EXAMPLES / "demo.yaml", path)
        loaded = Loaded(path)
        cached = loaded.catalog
        figures = {
            "cached": per_call(lambda: cached, args.calls),
            "current": per_call(loaded.current, args.calls),
            "look": per_call(loaded.check_now, args.calls // 10),
        }
        text = path.read_text()
        edits = 20

        def reload() -> None:
            path.write_text(text + f"\n# edit {time.perf_counter_ns()}\n")
            loaded.check_now()

        figures["reload"] = per_call(reload, edits)
    for name, ns in figures.items():
        print(f"{name:8} {ns:12.0f} ns per call")
    print(f"current/cached {figures['current'] / figures['cached']:.2f}x")


if __name__ == "__main__":
    main()
