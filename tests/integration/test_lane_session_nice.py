"""A bulk worker's niceness holds against processes of other sessions (tasks/lanes.py
`nice_session`). Where Linux schedules each session as one group (autogroup, on in this kernel
and most distributions'), a process's own niceness weighs only against its session's other
processes: two CPU-bound processes in sessions of their own, one at niceness 10, share one CPU
half and half. With its session niced too the niced one gives way. Measured on real processes
pinned to one CPU, their CPU time read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clarion.tasks import lanes

pytestmark = pytest.mark.integration

ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")
WINDOW = 1.5  # seconds both spin together on one CPU

SPIN = """
import os
os.sched_setaffinity(0, {{{cpu}}})
os.nice({nice})
if {session}:
    from clarion.tasks.lanes import nice_session
    why = nice_session({nice})
    assert why is None, why
print("spinning", flush=True)
while True:
    pass
"""


def _spinner(nice: int, session: bool) -> subprocess.Popen[str]:
    cpu = min(os.sched_getaffinity(0))
    code = SPIN.format(cpu=cpu, nice=nice, session=session)
    spinner = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert spinner.stdout is not None and spinner.stdout.readline().strip() == "spinning"
    return spinner


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


def _shares(session: bool) -> tuple[float, str]:
    """CPU time of a niceness-0 spinner over a niceness-10 one, sharing one CPU, each in a
    session of its own; and the niced one's /proc autogroup line."""
    plain, niced = _spinner(0, False), _spinner(10, session)
    try:
        group = Path(f"/proc/{niced.pid}/autogroup").read_text().strip()
        before = _cpu_ticks(plain.pid), _cpu_ticks(niced.pid)
        time.sleep(WINDOW)
        after = _cpu_ticks(plain.pid), _cpu_ticks(niced.pid)
    finally:
        for spinner in (plain, niced):
            spinner.kill()
            spinner.wait()
    got_plain, got_niced = after[0] - before[0], after[1] - before[1]
    assert got_plain + got_niced > 0
    return got_plain / max(1, got_niced), group


@pytest.mark.skipif(
    not ENABLED.exists() or ENABLED.read_text().strip() != "1",
    reason="this kernel does not group processes by session (no autogroup): nothing to show",
)
def test_a_niced_process_gives_way_across_sessions_only_with_its_session_niced():
    alone, group = _shares(session=False)
    assert group.endswith("nice 0"), group
    # the problem the session's niceness solves: the process's own niceness 10 counts for
    # nothing against another session (weights 1024 : 110 would be ~9 : 1)
    assert 0.5 < alone < 2, f"{alone:.2f}: own niceness alone already weighed across sessions"
    with_session, group = _shares(session=True)
    assert group.endswith("nice 10"), group
    assert with_session > 3, f"{with_session:.2f}: the niced session did not give way"


def test_a_process_that_does_not_lead_its_session_leaves_the_session_alone():
    assert os.getsid(0) != os.getpid()  # pytest runs in the shell's (or CI's) session
    before = Path(lanes.AUTOGROUP).read_text()
    assert lanes.nice_session(5) == (
        "this process does not lead its session (its niceness applies within it)"
    )
    assert Path(lanes.AUTOGROUP).read_text() == before
    assert lanes.nice_session(0) == "no niceness asked"


def test_without_autogroup_the_reason_is_given(tmp_path):
    code = (
        "import os, sys\n"
        "os.setsid()\n"
        "from clarion.tasks.lanes import nice_session\n"
        f"print(nice_session(4, {str(tmp_path / 'absent')!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("FileNotFoundError"), out.stdout + out.stderr
