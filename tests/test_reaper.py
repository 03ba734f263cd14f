"""The reaper stops a driver's whole family: the processes that carry its tag, and the
descendants of those that do not (Ray's agents overwrite their environment when they rename
themselves), even once they are re-parented; never a process that only reuses a recorded pid."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from smallinit.sweeper.runtime import cluster

# A sweep runs it by path (python -I -S reaper.py ...); loaded here from that path, as a module.
_spec = importlib.util.spec_from_file_location("reaper", Path(cluster.__file__).with_name("reaper.py"))
reaper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reaper)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_untagged_descendant_is_stopped_after_its_tagged_parent_died():
    marker = f"SMALLINIT_TEST_TAG={uuid.uuid4().hex}"
    var, value = marker.split("=")
    # A tagged shell whose child drops the environment (as setproctitle leaves an agent's), prints its pid, waits.
    parent = subprocess.Popen(["sh", "-c", "env -i sleep 60 & echo $!; wait"], env={**os.environ, var: value},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(parent.stdout.readline())
    stranger = subprocess.Popen(["sleep", "60"])  # untagged, not in the family
    try:
        time.sleep(0.2)  # the child has exec'd sleep with the empty environment
        assert reaper.tagged(marker.encode()) == [parent.pid]
        family = reaper.Family(marker.encode())
        family.record()
        assert set(family.seen) == {parent.pid, child}
        os.kill(parent.pid, signal.SIGKILL)  # the child is re-parented; only the record knows it now
        parent.wait()
        assert _alive(child) and reaper.tagged(marker.encode()) == []
        reaper.stop_all(family)
        deadline = time.time() + 5
        while _alive(child) and time.time() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
        assert stranger.poll() is None
    finally:
        for pid in (child, stranger.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        stranger.wait()


def test_a_recorded_pid_taken_by_another_process_is_left_alone():
    family = reaper.Family(b"SMALLINIT_TEST_TAG=none")
    me = os.getpid()
    family.seen = {me: reaper.processes()[me][1] + 1}  # this pid, but recorded with another start time
    assert family.alive() == []


def test_descendants_walks_the_tree_below_the_roots_only():
    procs = {1: (0, 10), 2: (1, 20), 3: (2, 30), 4: (1, 40), 5: (3, 50)}
    assert reaper.descendants([2], procs) == {2: 20, 3: 30, 5: 50}
    assert reaper.descendants([9], procs) == {}


def test_a_zombie_is_not_alive_so_the_reaper_does_not_wait_on_it():
    """A tagged child that exited but is not reaped yet: the tag search never saw it (its
    environ reads empty); the recorded family must not keep it either, or stop_all would spin
    to GIVE_UP_S signalling a process that has ended."""
    marker = f"SMALLINIT_TEST_TAG={uuid.uuid4().hex}"
    var, value = marker.split("=")
    child = subprocess.Popen(["sleep", "60"], env={**os.environ, var: value})
    try:
        family = reaper.Family(marker.encode())
        family.record()
        assert child.pid in family.seen
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.time() + 5
        while _alive(child.pid) and time.time() < deadline:  # a zombie until this process waits on it
            time.sleep(0.05)
        started = time.monotonic()
        reaper.stop_all(family)
        assert family.alive() == [] and time.monotonic() - started < 3
    finally:
        child.kill()
        child.wait()
