"""Stop every process of a local Ray cluster within seconds of its driver's end, however it
ends (kill -9 included).

Ray ties its GCS and raylet to the driver (PR_SET_PDEATHSIG), but the agents and workers
are the raylet's children and notice its death only after their own timeouts (about a
minute, measured on Ray 2.60). So the driver marks its environment with a unique tag before
it starts Ray (every Ray process, workers included, inherits it) and starts this script
beside it, in its own session (a kill of the driver's process group spares it). The script
waits until the driver's end of its stdin pipe closes (the kernel closes it on any exit) or
it is re-parented, then stops every process that carries the tag: SIGTERM, then SIGKILL.

The tag alone misses some: Ray's agents (ray::DashboardAgent, ray::RuntimeEnvAgent) rename
themselves with setproctitle, which overwrites their environment in /proc, and once the raylet
is gone they are re-parented. So while it waits, the script also records, each second, every
descendant of a tagged process with its start time, and stops those too: a recorded pid whose
start time still matches is the same process (a reused pid has another).

Standard library only, run by path (`python -I -S reaper.py TAG_VAR TAG DRIVER_PID`): it
must start fast and import nothing of the project or of Ray.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

GRACE_S = 2.0  # SIGTERM first: a worker gets this long to exit on its own, then SIGKILL
GIVE_UP_S = 15.0  # a process that survives SIGKILL this long is stuck in the kernel: leave it


def tagged(marker: bytes) -> list[int]:
    """The pids whose environment holds marker (b"VAR=value"), this process excepted."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if marker in env.split(b"\0"):
            out.append(int(name))
    return out


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time in clock ticks since boot), from /proc/PID/stat, for the
    living: a zombie has ended (its parent has not reaped it yet) and no signal reaches it."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # the name in parentheses may hold spaces
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            out[int(name)] = (int(fields[1]), int(fields[19]))
    return out


def descendants(roots: list[int], procs: dict[int, tuple[int, int]]) -> dict[int, int]:
    """pid -> start time of every process in `roots` and below them."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [p for p in roots if p in procs]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out[pid] = procs[pid][1]
            todo.extend(children.get(pid, []))
    return out


class Family:
    """The tagged processes and every descendant seen of them, each with its start time."""

    def __init__(self, marker: bytes) -> None:
        self.marker, self.seen = marker, {}

    def record(self) -> None:
        procs = processes()
        self.seen = {pid: t for pid, t in self.seen.items() if procs.get(pid, (0, None))[1] == t}  # the gone left out
        self.seen.update(descendants(tagged(self.marker), procs))

    def alive(self) -> list[int]:
        self.record()  # those started since the last look, and any tagged one
        return sorted(self.seen)


def stop_all(family: Family) -> None:
    """SIGTERM the family, SIGKILL what is left after GRACE_S; repeat until none is left twice
    in a row (a dying raylet may still start a worker)."""
    start, quiet = time.monotonic(), 0
    while quiet < 2 and time.monotonic() - start < GIVE_UP_S:
        pids = family.alive()
        if not pids:
            quiet += 1
            time.sleep(0.1)
            continue
        quiet = 0
        sig = signal.SIGTERM if time.monotonic() - start < GRACE_S else signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(0.2)


def wait_for_driver(driver_pid: int, family: Family) -> None:
    """Return when stdin reaches EOF (the driver closed it or died) or the driver is gone,
    recording the family each second meanwhile."""
    while os.getppid() == driver_pid:
        family.record()
        ready, _, _ = select.select([0], [], [], 1.0)
        if ready and not os.read(0, 4096):
            return


def main(argv: list[str]) -> None:
    var, tag, driver_pid = argv[0], argv[1], int(argv[2])
    # Ctrl-C in the terminal is the driver's to handle (a clean stop); this script waits it out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    family = Family(f"{var}={tag}".encode())
    wait_for_driver(driver_pid, family)
    stop_all(family)


if __name__ == "__main__":
    main(sys.argv[1:])
