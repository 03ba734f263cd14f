"""One trainer per trial folder: `<trial folder>/trial.lock`, held while a process trains it.

A second process on the same folder (another worker, another driver's worker, a single run
resuming it) gets TrialBusy at once instead of training over the first. It is a POSIX record
lock (fcntl.lockf), which the kernel drops when its holder dies, `kill -9` included; its text
(pid, host) is for the message the second process gives. The sweep driver's own folder lock
(sweeper/runtime/lock.py) is the same kind of lock and reads its text with read_holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from pathlib import Path


class TrialBusy(RuntimeError):
    """Another process holds this trial folder's lock."""


def read_holder(fd: int) -> dict | None:
    """The lock file's text as a dict (pid, host, ...), or None where it is empty or damaged."""
    try:
        text = os.pread(fd, 4096, 0).decode()
        holder = json.loads(text) if text.strip() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


@contextlib.contextmanager
def trial_lock(path: Path):
    """Hold `path` (a trial folder's trial.lock) while this process trains the trial."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                holder = read_holder(fd) or {}
                raise TrialBusy(f"another worker is training this trial folder (pid {holder.get('pid')} on "
                                f"{holder.get('host')}); it was not trained twice") from None
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the lock
