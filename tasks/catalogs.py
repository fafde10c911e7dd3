"""The catalog this process runs with, and how a changed catalog file reaches it without a restart.

`Loaded.current()` (what runtime.catalog() returns) looks at the file at most once every
CHECK_EVERY seconds, with one os.stat. A changed (mtime, size, inode) reads the file; a changed
sha256 builds and checks the new catalog as a starting worker does (every template rendered). The
new catalog replaces the running one only if it loads and every template version both have is
unchanged: a request is pinned to a version number when it is made, so the text behind a number
must not move under it (add version N+1 instead). Otherwise the running catalog stays and the
refusal is logged once per digest (`catalog_reload_refused`). `check_now()` skips the wait: a
worker missing a type or version looks at the file before it defers the delivery.

A pool process looks when a task asks for the catalog, and also on its own (`watch()`: a thread
that calls `current()` every interval), so an idle process is not left on the old catalog: it
would otherwise keep it for good if the file went bad before its next task. A forked child keeps
the catalog its parent checked at start (`after_fork()`), rather than reading the file again: a
pool process started while the file is broken runs the last good catalog, as its parent does.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from clarion.catalog import Catalog, CatalogError

log = logging.getLogger(__name__)
CHECK_EVERY = 1.0  # seconds between two looks at the catalog file


def pinned_changes(old: Catalog, new: Catalog) -> list[str]:
    """`type vN` for every template version both catalogs have whose content differs."""
    return [
        f"{key} v{version}"
        for key, ntype in sorted(old.types.items())
        if (other := new.get(key)) is not None
        for version, template in sorted(ntype.templates.items())
        if version in other.templates and other.templates[version] != template
    ]


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino)


def _look_while_alive(source: weakref.ref[Loaded], every: float) -> None:
    """The watch: `current()` every interval until the Loaded is gone (a test's, or replaced)."""
    while True:
        time.sleep(every)
        loaded = source()
        if loaded is None:
            return
        try:
            loaded.current()
        except Exception:  # noqa: BLE001 - a look must never end the watch
            log.exception("catalog look failed", extra={"action": "catalog_look_failed"})
        del loaded


class Loaded:
    """A catalog file and the catalog built from it, reloaded when the file changes."""

    def __init__(
        self,
        path: Path,
        *,
        demo: bool = False,
        every: float = CHECK_EVERY,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.demo = demo
        self.every = every
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._stamp = _stamp(path)
        self.catalog = Catalog.from_yaml(path)  # a broken file at start is the caller's error
        self._refused = ""
        self._next = monotonic() + every
        self._watching: int | None = None  # the pid whose thread looks at the file
        announce(self.catalog, demo=demo)

    def after_fork(self) -> None:
        """In a forked child: keep the catalog, renew the lock (another thread may have held it)."""
        self._lock = threading.Lock()

    def watch(self) -> None:
        """Look at the file every interval from a daemon thread of this process (once per pid),
        whether or not a task asks: for a pool process that may sit idle through an edit."""
        if self._watching == os.getpid():
            return
        self._watching = os.getpid()
        threading.Thread(
            target=_look_while_alive,
            args=(weakref.ref(self), self.every),
            name="clarion-catalog-watch",
            daemon=True,
        ).start()

    def current(self) -> Catalog:
        """The running catalog; at most once every `every` seconds, reloaded if the file changed."""
        if self._monotonic() >= self._next:
            self.check_now()
        return self.catalog

    def check_now(self) -> Catalog:
        """Look at the file now; reload it if it changed and the new catalog may replace this one."""
        with self._lock:
            self._next = self._monotonic() + self.every
            stamp = _stamp(self.path)
            if stamp is None or stamp == self._stamp:
                return self.catalog
            self._stamp = stamp
            self._reload()
        return self.catalog

    def _reload(self) -> None:
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            self._refuse("", f"cannot read {self.path}: {exc}")
            return
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self.catalog.digest:  # touched, or changed and changed back
            return
        try:
            new = Catalog.from_bytes(raw, str(self.path)).check()
        except CatalogError as exc:
            self._refuse(digest, str(exc))
            return
        changed = pinned_changes(self.catalog, new)
        if changed:
            self._refuse(
                new.digest,
                f"{new.name} rewrites template versions requests may be pinned to: "
                f"{', '.join(changed)} (add a new version instead)",
            )
            return
        old, self.catalog, self._refused = self.catalog, new, ""
        log.warning(
            "catalog reloaded: %s (was sha256 %s)",
            new.name,
            old.digest[:12],
            extra={
                "action": "catalog_reloaded",
                "path": new.source,
                "digest": new.digest,
                "previous": old.digest,
                "types": len(new.types),
            },
        )

    def _refuse(self, what: str, why: str) -> None:
        if what and what == self._refused:
            return
        self._refused = what
        log.error(
            "catalog change refused, still running %s: %s",
            self.catalog.name,
            why,
            extra={"action": "catalog_reload_refused", "path": str(self.path), "reason": why},
        )


class Fixed:
    """A catalog built in Python (`CLARION_CATALOG=package.module:NAME`): no file to watch."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.demo = False
        announce(catalog, demo=False)

    def current(self) -> Catalog:
        return self.catalog

    def check_now(self) -> Catalog:
        return self.catalog

    def after_fork(self) -> None:
        pass

    def watch(self) -> None:
        pass


def announce(catalog: Catalog, *, demo: bool) -> None:
    """Say which catalog this process runs with (every process, at its first use of it)."""
    facts = {
        "action": "catalog_loaded",
        "path": catalog.source,
        "digest": catalog.digest,
        "types": len(catalog.types),
        "pid": os.getpid(),
    }
    if demo:
        log.warning(
            "CLARION_CATALOG is not set: running the built-in DEMO catalog %s; "
            "set CLARION_CATALOG to your catalog file",
            catalog.name,
            extra={**facts, "demo": True},
        )
    else:
        log.info("catalog %s, %d types", catalog.name, len(catalog.types), extra=facts)
