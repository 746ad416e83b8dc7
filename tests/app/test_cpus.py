"""RANKBOARD_SERVER_CPUS's parts: the CPU list as taskset writes it, every thread of a process kept to some CPUs, and a
child started with every CPU from a thread kept to one. (The whole server kept to a CPU, and its runs on every one:
tests/e2e/test_run_lifecycle.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from app.core import cpus


@pytest.mark.parametrize(("text", "expected"), [("3", {3}), ("0-3,6", {0, 1, 2, 3, 6}), (" 1 , 4-5", {1, 4, 5})])
def test_a_cpu_list_reads_as_taskset_writes_it_and_back(text: str, expected: set[int]) -> None:
    assert cpus.parse(text) == expected
    assert cpus.parse(cpus.describe(frozenset(expected))) == expected


@pytest.mark.parametrize(("text", "problem"), [("x", "'x' is not a CPU number"), ("0,,1", "'' is not a CPU number"),
                                                ("3-1", "'3-1' runs backwards"), ("1-", "'1-' is not")])  # fmt: skip
def test_a_malformed_cpu_list_is_refused_saying_which_part(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        cpus.parse(text)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_thread_kept_to_one_cpu_starts_a_process_on_every_cpu_and_keeps_its_own() -> None:
    every_cpu = frozenset(os.sched_getaffinity(0))
    seen: dict[str, object] = {}

    def server_thread() -> None:
        os.sched_setaffinity(0, {min(every_cpu)})  # this thread alone, as keep_to leaves each of the server's
        with cpus.everywhere(every_cpu):
            child = subprocess.Popen(["sleep", "30"])
        seen["child"], seen["thread"] = os.sched_getaffinity(child.pid), os.sched_getaffinity(0)
        child.kill()
        child.wait()

    thread = threading.Thread(target=server_thread)
    thread.start()
    thread.join()
    assert seen == {"child": every_cpu, "thread": {min(every_cpu)}}
    assert os.sched_getaffinity(0) == every_cpu  # the test's own thread was never touched


KEPT = """
import json, os, sys, threading
from app.core import cpus

def note_thread():  # each thread says its own id, then waits until the masks are read
    ids.append(threading.get_native_id())
    noted.wait()
    stop.wait()

ids, noted, stop = [threading.get_native_id()], threading.Barrier(5), threading.Event()
for _ in range(3):
    threading.Thread(target=note_thread).start()
cpus.keep_to(frozenset({int(sys.argv[1])}))
threading.Thread(target=note_thread).start()  # started later, by the main thread
noted.wait()
print(json.dumps({str(tid): sorted(os.sched_getaffinity(tid)) for tid in ids}))
stop.set()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_keeping_the_server_to_a_cpu_reaches_every_thread_it_has_and_starts() -> None:
    """In a process of its own: keep_to changes the masks of the whole process it runs in."""
    cpu = max(os.sched_getaffinity(0))
    shown = subprocess.run([sys.executable, "-c", KEPT, str(cpu)], capture_output=True, text=True, check=True)
    masks = json.loads(shown.stdout)
    assert len(masks) == 5 and set(map(tuple, masks.values())) == {(cpu,)}
