"""One plain PostgreSQL 15 (the system's binaries) on a rig host, as the `postgres` user, with its
data under a folder of its own (PostgreSQL refuses root; pytest's tmp_path is root's alone).

    url = start_postgres(rig, "db", Path("/tmp/clarion-db-<pid>"))
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import psycopg

from tests.support.hosts import Rig

BIN = Path("/usr/lib/postgresql/15/bin")
USER, PORT, DATABASE = "postgres", 5432, "clarion"
SOCKETS = "/run/postgresql"  # the host's own (private): the system PostgreSQL keeps its socket


def start_postgres(rig: Rig, host: str, folder: Path, timeout: float = 60) -> str:
    """initdb, start on the host's address (trust for the rig's /24), create the database; its URL."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.chown(folder, USER)
    data = folder / "data"
    subprocess.run(
        [
            "setpriv",
            f"--reuid={USER}",
            f"--regid={USER}",
            "--init-groups",
            str(BIN / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            USER,
            "--no-sync",
        ],
        check=True,
        capture_output=True,
    )
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {rig.subnet}.0/24 trust\n")
    address = rig.address(host)
    rig.start(
        host,
        [
            str(BIN / "postgres"),
            "-D",
            str(data),
            "-c",
            f"listen_addresses={address}",
            "-p",
            str(PORT),
            "-c",
            f"unix_socket_directories={SOCKETS}",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=300",
        ],
        user=USER,
        private=[SOCKETS],
        log=folder / "postgres.log",
    )
    admin = f"postgresql://{USER}@{address}:{PORT}/postgres"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(admin, connect_timeout=2, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DATABASE}")
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    return f"postgresql://{USER}@{address}:{PORT}/{DATABASE}"
