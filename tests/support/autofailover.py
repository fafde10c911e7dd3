"""PostgreSQL HA on rig hosts with pg_auto_failover (Debian's postgresql-15-auto-failover,
`make hosts-deps`): a monitor and two data nodes, synchronously replicated, each a real
`pg_autoctl ... --run` process in its own host.

    ha = AutoFailover(rig, folder, monitor="monitor", nodes=("db1", "db2"))
    ha.start()                     # returns when a primary and a secondary are in sync
    ha.url                         # postgresql://postgres@db1:5432,db2:5432/clarion?target_session_attrs=read-write
    old = ha.primary(); rig.kill(old); ha.wait_primary(other=old)

The processes run as the `postgres` system user (PostgreSQL refuses root), with data and
pg_autoctl's state under `folder`; the system's PostgreSQL on 5432 is another network namespace's.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import psycopg

from tests.support.hosts import Rig

PG_CTL = "/usr/lib/postgresql/15/bin/pg_ctl"
USER = "postgres"
# docs/beyond-one-machine.md, "A worker host cut off mid-transaction"
DEAD_CLIENTS = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "10000",
    "idle_in_transaction_session_timeout": "60s",
}
PORT = 5432
DATABASE = "clarion"
# pg_autoctl puts PostgreSQL's socket here, where the system PostgreSQL has its own on 5432: each
# host sees a folder of its own there
SOCKETS = "/run/postgresql"
WRITABLE = ("single", "primary", "wait_primary")  # pg_auto_failover's states of a writable node


class AutoFailover:
    def __init__(
        self, rig: Rig, folder: Path, *, monitor: str = "monitor", nodes: Sequence[str]
    ) -> None:
        self.rig, self.folder, self.monitor, self.nodes = rig, folder, monitor, tuple(nodes)
        self.expect_dead = False  # set once a host is killed on purpose
        folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, USER)

    @property
    def url(self) -> str:
        hosts = ",".join(f"{self.rig.address(n)}:{PORT}" for n in self.nodes)
        return f"postgresql://{USER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    @property
    def monitor_url(self) -> str:
        address = self.rig.address(self.monitor)
        return f"postgresql://autoctl_node@{address}:{PORT}/pg_auto_failover?sslmode=disable"

    def node_url(self, name: str, database: str = DATABASE) -> str:
        return f"postgresql://{USER}@{self.rig.address(name)}:{PORT}/{database}"

    def _env(self, name: str) -> dict[str, str]:
        home = self.folder / name
        for sub in ("config", "data", "run"):
            (home / sub).mkdir(parents=True, exist_ok=True)
            shutil.chown(home / sub, USER)
        shutil.chown(home, USER)
        return {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "PGDATA": str(home / "pgdata"),
        }

    def _start(self, name: str, args: list[str]) -> None:
        env = self._env(name)
        common = ["--pgctl", PG_CTL, "--pgport", str(PORT), "--hostname", self.rig.address(name)]
        self.rig.start(
            name,
            ["pg_autoctl", *args, *common, "--auth", "trust", "--no-ssl", "--run"],
            env=env,
            user=USER,
            private=[SOCKETS],
            log=self.folder / f"{name}.log",
        )

    def start(self, timeout: float = 180) -> None:
        """The monitor, then the nodes one by one (the first becomes the primary); returns when
        both data nodes are in sync (primary and secondary)."""
        self._start(self.monitor, ["create", "monitor"])
        self._wait(lambda: self._monitor_answers(), timeout, "the monitor did not start")
        for i, name in enumerate(self.nodes):
            self._start(
                name,
                [
                    "create",
                    "postgres",
                    "--monitor",
                    self.monitor_url,
                    "--dbname",
                    DATABASE,
                    "--pg-hba-lan",
                ],
            )
            want = {"single"} if i == 0 else {"primary", "secondary"}
            check = partial(self._reached, want)
            if i:
                check = partial(self._checkpointing, self.nodes[0], check)
            self._wait(check, timeout, f"{name} not up")
            if i == 0:  # the standby's base backup copies them (postgresql.auto.conf)
                self._dead_clients(name)

    def _dead_clients(self, name: str) -> None:
        """The server settings docs/beyond-one-machine.md recommends for a client host that
        drops off mid-transaction: without them its backend holds its locks until TCP's own
        two-hour keepalive, and every worker that needs one of those rows waits as long."""
        with psycopg.connect(self.node_url(name), connect_timeout=5, autocommit=True) as conn:
            for setting, value in DEAD_CLIENTS.items():
                conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")

    def _checkpointing(self, primary: str, check: Callable[[], bool]) -> bool:
        """`check()`, after a CHECKPOINT on `primary`: a standby's pg_basebackup (as pg_autoctl
        runs it) waits for a spread checkpoint, up to minutes on an idle server; one asked for
        meanwhile completes it at once."""
        url = self.node_url(primary)
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(url, connect_timeout=2, autocommit=True) as conn,
        ):
            conn.execute("CHECKPOINT")
        return check()

    def _reached(self, states: set[str]) -> bool:
        return states <= set(self.states().values())

    def _monitor_answers(self) -> bool:
        try:
            with psycopg.connect(self.monitor_url, connect_timeout=1):
                return True
        except psycopg.Error:
            return False

    def states(self) -> dict[str, str]:
        """Each node's reported state, as the monitor knows it (host name -> state)."""
        by_address = {self.rig.address(n): n for n in self.nodes}
        try:
            with psycopg.connect(self.monitor_url, connect_timeout=2) as conn:
                rows = conn.execute(
                    "SELECT nodehost, reportedstate FROM pgautofailover.node"
                ).fetchall()
        except psycopg.Error:
            return {}
        return {by_address.get(str(host), str(host)): str(state) for host, state in rows}

    def primary(self) -> str:
        [name] = [n for n, s in self.states().items() if s in WRITABLE]
        return name

    def wait_primary(self, *, other_than: str, timeout: float = 120) -> str:
        """Wait until a node other than `other_than` is the writable primary; its host name."""

        def promoted() -> bool:
            states = self.states()
            return any(s in WRITABLE for n, s in states.items() if n != other_than)

        self.expect_dead = True
        self._wait(promoted, timeout, "no failover")
        [name] = [n for n in self.nodes if n != other_than]
        return name

    def sync_standby_names(self, name: str) -> str:
        with psycopg.connect(self.node_url(name), connect_timeout=2) as conn:
            return str(conn.execute("SHOW synchronous_standby_names").fetchone()[0])  # type: ignore[index]

    def _wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            dead = [
                p.command[-1] for n in self.nodes for p in self.rig.processes[n] if not p.alive()
            ]
            if self.rig.processes[self.monitor] and not self.rig.processes[self.monitor][0].alive():
                dead.append("the monitor")
            if dead and not self.expect_dead:
                raise AssertionError(f"{what}: pg_autoctl exited ({dead}); see {self.folder}")
            time.sleep(1)
        raise AssertionError(f"{what} after {timeout} s; see {self.folder}")
