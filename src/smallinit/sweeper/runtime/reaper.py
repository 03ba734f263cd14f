"""Stop every process of a local Ray cluster within seconds of its driver's end, however it
ends (kill -9 included).

Ray ties its GCS and raylet to the driver (PR_SET_PDEATHSIG), but the agents and workers
are the raylet's children and notice its death only after their own timeouts (about a
minute, measured on Ray 2.60). So the driver marks its environment with a unique tag before
it starts Ray (every Ray process, workers included, inherits it) and starts this script
beside it, in its own session (a kill of the driver's process group spares it). The script
waits until the driver's end of its stdin pipe closes (the kernel closes it on any exit) or
it is re-parented, then stops every process that carries the tag: SIGTERM, then SIGKILL.

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


def stop_all(marker: bytes) -> None:
    """SIGTERM every tagged process, SIGKILL what is left after GRACE_S; repeat until none
    is left twice in a row (a dying raylet may still start a worker)."""
    start, quiet = time.monotonic(), 0
    while quiet < 2 and time.monotonic() - start < GIVE_UP_S:
        pids = tagged(marker)
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


def wait_for_driver(driver_pid: int) -> None:
    """Return when stdin reaches EOF (the driver closed it or died) or the driver is gone."""
    while os.getppid() == driver_pid:
        ready, _, _ = select.select([0], [], [], 1.0)
        if ready and not os.read(0, 4096):
            return


def main(argv: list[str]) -> None:
    var, tag, driver_pid = argv[0], argv[1], int(argv[2])
    # Ctrl-C in the terminal is the driver's to handle (a clean stop); this script waits it out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wait_for_driver(driver_pid)
    stop_all(f"{var}={tag}".encode())


if __name__ == "__main__":
    main(sys.argv[1:])
