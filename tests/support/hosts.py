"""A multi-host rig on one machine: a network namespace per host, joined by a Linux bridge on a
private /24, each running real processes; faults are functions.

    with Rig(tmp_path, ("db", "broker", "w1", "receiver")) as rig:
        rig.start("db", ["postgres", ...])           # a real process inside host "db"
        rig.start("db", [...], private=["/run/postgresql"])  # a folder of the host's own
        rig.cut("w1"); ...; rig.heal("w1")           # its link down: silence, both ways
        rig.block("w1", "db")                        # w1 hears nothing from db (db's answers dropped)
        rig.degrade("w1", delay_ms=50, loss=5)       # tc netem on w1's link, both directions
        rig.skew("w1", 30)                           # processes started with clock=True run 30 s fast
        rig.kill("w1")                               # SIGKILL every process in the host

Needs root, `ip`, `tc` and libfaketime (`make hosts-deps`). Only its own namespaces and bridge are
ever a target: the bridge carries the /24's first address in the root namespace (so the test
process reaches every host), each host .10 upwards. Names carry the test process's PID; a rig left
behind by a process that died is removed by the next rig. Everything is removed on exit, including
after a failed test; processes are stopped by PID.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clarion.ops import launch

HOSTS = ("db", "broker", "w1", "w2", "w3", "receiver")
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEWED = Path(__file__).parent / "skewed"  # sitecustomize for a Python process on a skewed clock
PREFIX = "clarion-rig"  # namespace names: clarion-rig-<pid>-<rig>-<host>
CLONE_NEWNET = 0x40000000


def unavailable() -> str | None:
    """Why the rig cannot run here (a reason to show in a skip), or None."""
    if os.geteuid() != 0:
        return "the multi-host rig needs root (network namespaces)"
    missing = [t for t in ("ip", "tc", "ping") if shutil.which(t) is None]
    if missing or not FAKETIME.exists():
        return f"missing {', '.join(missing) or FAKETIME}: run `make hosts-deps`"
    return None


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> str:
    """10.231.k (a /24) that no address or route on this machine uses yet."""
    taken = _ip("-4", "route", "show", "table", "all") + _ip("-4", "addr")
    for k in [os.getpid() % 250, *range(250)]:
        if f"10.231.{k}." not in taken:
            return f"10.231.{k}"
    raise RuntimeError("no free 10.231.k.0/24 on this machine")


def remove_orphans() -> None:
    """Namespaces and bridges of rigs whose test process is gone."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0]
        if name.startswith(PREFIX + "-"):
            pid, rig = name.split("-")[2:4]
            if not _alive(int(pid)):
                _remove_netns(name)
                _ip("link", "del", f"clb{pid}s{rig}", check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_netns(name: str) -> None:
    for pid in _ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", name, check=False)


class NoNetem(RuntimeError):
    """tc netem is not in this kernel (degrade cannot add delay or loss)."""


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str
    link: str  # its veth's end on the bridge, in the root namespace
    clock_file: Path  # libfaketime's offset for processes started with clock=True


_RIGS = itertools.count()


class Rig:
    """Hosts on one bridge; see the module's docstring."""

    def __init__(self, folder: Path, names: Sequence[str] = HOSTS) -> None:
        self.folder = folder
        # Each rig its own names: a deleted namespace's veth goes away after the kernel's cleanup,
        # so the next rig of this process must not reuse its interface names.
        self.pid, self.seq = os.getpid(), next(_RIGS) % 100
        self.bridge = f"clb{self.pid}s{self.seq}"
        self.names = tuple(names)
        self.hosts: dict[str, Host] = {}
        self.processes: dict[str, list[launch.Process]] = {n: [] for n in names}
        self.subnet = ""

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (this test process)."""
        return f"{self.subnet}.1"

    def __enter__(self) -> Rig:
        remove_orphans()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.subnet = _free_subnet()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(self.names):
                self._add_host(i, name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_host(self, index: int, name: str) -> None:
        netns = f"{PREFIX}-{self.pid}-{self.seq}-{name}"
        link = f"clv{self.pid}s{self.seq}x{index}"  # at most 15 characters: 7-digit pid, s99, x9
        host = Host(name, netns, f"{self.subnet}.{10 + index}", link, self.folder / f"{name}.clock")
        host.clock_file.write_text("+0\n")
        self.hosts[name] = host
        _ip("netns", "add", netns)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", link, "master", self.bridge, "up")
        _ip("addr", "add", f"{host.address}/24", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)

    def close(self) -> None:
        """Stop every process (by PID), remove the namespaces and the bridge."""
        for name in self.hosts:
            for process in self.processes[name]:
                process.signal_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.popen.wait(10)
        for host in self.hosts.values():
            _remove_netns(host.netns)
        _ip("link", "del", self.bridge, check=False)

    def address(self, name: str) -> str:
        return self.hosts[name].address

    # --- processes ------------------------------------------------------------------------------

    def command(
        self,
        name: str,
        argv: Sequence[str],
        *,
        user: str | None = None,
        private: Sequence[str] = (),
    ) -> list[str]:
        """`argv` run inside host `name` (as `user`, when given: PostgreSQL refuses root).
        `private`: folders this host sees empty and its own (a tmpfs mounted over each in the
        process's mount namespace, which `ip netns exec` makes; the machine's stay untouched)."""
        drop = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"] if user else []
        inner = [*drop, *argv]
        if private:
            owner = f",uid={user},gid={user}" if user else ""
            mounts = " && ".join(
                f"mount -t tmpfs -o mode=0775{owner} tmpfs {shlex.quote(d)}" for d in private
            )
            inner = ["sh", "-c", f'{mounts} && exec "$@"', "sh", *inner]
        return ["ip", "netns", "exec", self.hosts[name].netns, *inner]

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        user: str | None = None,
        private: Sequence[str] = (),
        clock: bool = False,
    ) -> launch.Process:
        """A process in host `name`, stopped by the rig at the end (or by `kill`). `clock`: its
        wall clock is the host's, which `skew` moves (libfaketime); its monotonic clock is the
        machine's, as on a host whose wall clock NTP stepped. libfaketime's faked monotonic clock
        hangs Python's timed waits now and then (a deadline read on the wall clock's scale: see
        tests/support/skewed/sitecustomize.py, which also gives Python processes a `time.sleep`
        that works without it)."""
        extra = dict(env or {})
        if clock:
            extra |= {
                "LD_PRELOAD": str(FAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(self.hosts[name].clock_file),
                "FAKETIME_CACHE_DURATION": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "PYTHONPATH": os.pathsep.join(
                    p
                    for p in (
                        str(SKEWED),
                        extra.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")),
                    )
                    if p
                ),
            }
        process = launch.Process(
            self.command(name, argv, user=user, private=private), env=extra, log=log
        )
        self.processes[name].append(process)
        self._await_entry(name, process)
        return process

    def _await_entry(self, name: str, process: launch.Process, timeout: float = 10.0) -> None:
        """Return once `process` runs in host `name`'s network (`ip netns exec` enters it
        between fork and exec), so a fault applied next reaches it; or once it has exited."""
        there = os.stat(f"/run/netns/{self.hosts[name].netns}").st_ino
        deadline = time.monotonic() + timeout
        while process.popen.poll() is None:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if os.stat(f"/proc/{process.popen.pid}/ns/net").st_ino == there:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"pid {process.popen.pid} did not enter host {name}")
            time.sleep(0.005)

    def run(
        self, name: str, argv: Sequence[str], *, timeout: float = 30, user: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A short command in host `name`, waited for."""
        return subprocess.run(
            self.command(name, argv, user=user), capture_output=True, text=True, timeout=timeout
        )

    def kill(self, name: str) -> int:
        """SIGKILL every process in host `name` (what a host crash looks like); how many."""
        pids = _ip("netns", "pids", self.hosts[name].netns).split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        for process in self.processes[name]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(10)
        return len(pids)

    @contextlib.contextmanager
    def inside(self, name: str) -> Iterator[None]:
        """This thread in host `name`'s network: sockets created meanwhile belong to the host
        (a listening socket keeps serving there from any thread afterwards)."""
        libc = ctypes.CDLL(None, use_errno=True)
        with (
            open("/proc/thread-self/ns/net") as home,
            open(f"/run/netns/{self.hosts[name].netns}") as there,
        ):
            if libc.setns(there.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {name}")
            try:
                yield
            finally:
                if libc.setns(home.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the root namespace")

    def listen(self, name: str, port: int = 0) -> socket.socket:
        """A TCP listening socket on host `name`'s address."""
        with self.inside(name):
            return socket.create_server((self.address(name), port))

    # --- faults ---------------------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Host `name` off the network: its link down (packets to and from it vanish)."""
        _ip("link", "set", self.hosts[name].link, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].link, "up")

    def block(self, name: str, peer: str) -> None:
        """`name` hears nothing from `peer` (a one-way partition as `name` sees it: what it sends
        arrives, the answers are dropped in `peer`), while the rest of the network stays reachable."""
        _ip("route", "add", "blackhole", f"{self.address(name)}/32", netns=self.hosts[peer].netns)

    def unblock(self, name: str, peer: str) -> None:
        _ip("route", "del", "blackhole", f"{self.address(name)}/32", netns=self.hosts[peer].netns)

    def degrade(self, name: str, *, delay_ms: float = 0, loss: float = 0) -> None:
        """tc netem on host `name`'s link, each direction: `delay_ms` added, `loss` percent dropped."""
        spec = ["netem", "delay", f"{delay_ms}ms", "loss", f"{loss}%"]
        host = self.hosts[name]
        try:
            _tc("qdisc", "replace", "dev", host.link, "root", *spec)
        except RuntimeError as exc:
            if "qdisc kind is unknown" in str(exc):
                raise NoNetem(
                    "this kernel has no netem qdisc (sch_netem): no delay or loss"
                ) from exc
            raise
        _tc("qdisc", "replace", "dev", "eth0", "root", *spec, netns=host.netns)

    def restore(self, name: str) -> None:
        host = self.hosts[name]
        _tc("qdisc", "del", "dev", host.link, "root", check=False)
        _tc("qdisc", "del", "dev", "eth0", "root", netns=host.netns, check=False)

    def skew(self, name: str, seconds: float) -> None:
        """Processes started on host `name` with clock=True read wall time `seconds` off (within
        about a second: libfaketime reads the offset file once a second)."""
        self.hosts[name].clock_file.write_text(f"{seconds:+g}\n")


def _tc(*args: str, netns: str | None = None, check: bool = True) -> None:
    command = [*(["ip", "netns", "exec", netns] if netns else []), "tc", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
