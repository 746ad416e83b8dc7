"""How the server knows a run's processes: a pid and its start time name one process for good, an exited child
not yet reaped is no longer alive, and a launch's processes are found by its environment, orphans included."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from app.launcher import processes
from tests.live import wait_for


def test_a_process_is_named_by_its_start_in_ticks_since_boot_as_runs_stored_before_hold_it() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        ticks = processes.start_ticks(child.pid)
        # Run.pid_start_ticks keeps the kernel's own count (field 22 of stat), so a run stored before still matches.
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        assert ticks == int(stat.rsplit(")", 1)[1].split()[19])
        assert processes.is_alive(child.pid, ticks)
        assert not processes.is_alive(child.pid, ticks - 1)  # the pid, reused by another process
    finally:
        child.kill()
        child.wait()
    assert processes.start_ticks(child.pid) is None and not processes.is_alive(child.pid, None)


def test_a_child_that_exited_is_not_alive_before_it_is_reaped() -> None:
    child = subprocess.Popen(["true"])
    wait_for(lambda: processes.start_ticks(child.pid) is None, 10, what="the child to exit")
    assert not processes.is_alive(child.pid, None)
    assert child.wait() == 0  # it was a zombie until now: only its parent had not reaped it


def test_a_launchs_processes_are_found_by_their_environment_orphans_included() -> None:
    launch = {**os.environ, "RANKBOARD_TEST_LAUNCH": uuid.uuid4().hex}
    # A worker in a session of its own, as torchrun starts them; a grandchild whose parent has exited (an orphan);
    # one that exited, not yet reaped; and a process of another launch.
    worker = subprocess.Popen(["sleep", "60"], env=launch, start_new_session=True)
    parent = subprocess.Popen(
        ["sh", "-c", "sleep 60 >/dev/null & echo $!"], env=launch, stdout=subprocess.PIPE, text=True
    )
    ended = subprocess.Popen(["true"], env=launch)
    other = subprocess.Popen(["sleep", "60"], env={**launch, "RANKBOARD_TEST_LAUNCH": "another"})
    orphan = int(parent.communicate()[0])
    found: list[int] = []
    try:
        wait_for(lambda: processes.start_ticks(ended.pid) is None, 10, what="the short one to exit")
        found = processes.pids_with_env("RANKBOARD_TEST_LAUNCH", launch["RANKBOARD_TEST_LAUNCH"])
        assert sorted(found) == sorted([worker.pid, orphan])
    finally:
        processes.kill_all([worker.pid, orphan, other.pid])
        for child in (worker, ended, other):
            child.wait()
    wait_for(lambda: processes.start_ticks(orphan) is None, 10, what="the orphan to end")
