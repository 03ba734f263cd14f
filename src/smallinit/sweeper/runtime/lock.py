"""One driver per sweep folder: `<sweep folder>/driver.lock`, held for the whole sweep.

Two drivers on one folder would each plan the same trials and train them twice, into the
same trial folders. The lock is a POSIX record lock (fcntl.lockf) on that file: the kernel
drops it when its driver dies, `kill -9` included, so a lock left by a dead driver never
blocks a rerun; it works across hosts on NFS. The file's text (pid, host, since) is for the
message a second driver prints. Where the filesystem has no locks (ENOLCK), the text alone
decides: a lock naming a dead pid on this host is stale and taken over.

Taking the lock is also the sweep's first write to its folder, so an unwritable folder is
refused here, in one line, before the study or any trial folder is created; so is a folder that
holds files but none a sweep writes (`/`, a home folder, a source tree): a sweep writes only
into a new or empty folder or its own.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from smallinit.core.errors import ConfigError
from smallinit.core.trial_lock import read_holder

LOCK_FILE = "driver.lock"
# What any sweep folder holds once its driver has written anything (the study is a file here
# unless hydra.sweeper.storage names another); one of them marks the folder as a sweep's.
SWEEP_MARKS = (LOCK_FILE, "fixed_overrides.json", "trials", "optuna.db", "results.parquet")


def check_sweep_folder(sweep_dir: Path) -> None:
    """Refuse a folder that holds files and no mark of a sweep, before anything is written."""
    try:
        # Hidden files (.gitkeep, .DS_Store, NFS's .nfsXXXX of an unlinked lock) and a fresh file
        # system's lost+found are not a user's files.
        names = sorted(n for n in os.listdir(sweep_dir) if not n.startswith(".") and n != "lost+found") \
            if sweep_dir.is_dir() else []
    except OSError:
        return  # unreadable: acquire's first write names it
    if names and not set(names) & set(SWEEP_MARKS):
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ConfigError(f"hydra.sweep.dir={str(sweep_dir)!r} is invalid: it holds files no sweep wrote ({shown}); "
                          "a sweep writes into a new or empty folder or its own: choose one with name=... or "
                          "hydra.sweep.dir=... (nothing was written)")


def hold_driver_lock(sweep_dir: Path) -> DriverLock:
    """Take the folder's lock for the rest of this process: released by an exit hook (sweep.py
    runs them on every ending), and by the kernel if the process dies without them."""
    import atexit

    lock = DriverLock(sweep_dir)
    lock.acquire()
    atexit.register(lock.release)
    return lock


class DriverLock:
    """`with DriverLock(sweep_dir):` the sweep; raises ConfigError if another driver holds it."""

    def __init__(self, sweep_dir: Path):
        self.sweep_dir = Path(sweep_dir)
        self.path = self.sweep_dir / LOCK_FILE
        self.fd: int | None = None
        self.created: list[Path] = []  # folders this lock created, deepest first
        self.took_over: dict | None = None  # the dead driver whose lock this one replaced

    def __enter__(self) -> DriverLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        check_sweep_folder(self.sweep_dir)
        try:
            self.created = [p for p in (self.sweep_dir, *self.sweep_dir.parents) if not p.exists()]
            self.sweep_dir.mkdir(parents=True, exist_ok=True)
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    previous = self._lock(fd)
                    # A driver that released between our open and our lock unlinked this file,
                    # and a third may have created a new one: hold the lock on the file at the path.
                    if os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                        break
                except BaseException:
                    os.close(fd)
                    raise
                os.close(fd)
            self.fd = fd
            if previous:
                self.took_over = previous
            text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                               "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
            # Write over, then cut: the file is never empty while held (a reader may still catch
            # the new text ahead of the old one's tail, which _read_holder waits out).
            os.pwrite(fd, text.encode(), 0)
            os.ftruncate(fd, len(text.encode()))
            os.fsync(fd)
        except OSError as e:
            self.release()
            raise ConfigError(f"hydra.sweep.dir={str(self.sweep_dir)!r} is invalid: cannot write there "
                              f"({e.strerror}: {e.filename or self.path}); choose a writable folder with "
                              "name=... or hydra.sweep.dir=...") from None
        if self.took_over:
            h = self.took_over
            print(f"taking over {self.path}: its driver (pid {h.get('pid')} on {h.get('host')}, "
                  f"since {h.get('since')}) is gone", flush=True)

    def _lock(self, fd: int) -> dict | None:
        """Lock fd; return the text of a lock left by a dead driver (None for a fresh file)."""
        holder = read_holder(fd)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                raise ConfigError(self._in_use(_read_holder(fd) or holder)) from None
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            # No record locks on this filesystem: trust the text where it can be checked.
            if holder and not (holder.get("host") == socket.gethostname() and not _alive(holder.get("pid"))):
                raise ConfigError(self._in_use(holder)) from None
        return holder

    def _in_use(self, holder: dict | None) -> str:
        who = (f"pid {holder.get('pid')} on host {holder.get('host')}, since {holder.get('since')}"
               if holder else "its lock file gives no pid")
        return (f"{self.sweep_dir} is in use by another sweep driver ({who}); wait for it to end or stop it, "
                f"or use another name=...")

    def release(self) -> None:
        if self.fd is not None:
            # Unlink while holding the lock: a driver waiting on this file sees a stale inode and retries.
            try:
                self.path.unlink(missing_ok=True)
            finally:
                os.close(self.fd)
                self.fd = None
        for folder in self.created:  # a sweep refused before it wrote anything leaves no folder
            try:
                folder.rmdir()  # only if empty
            except OSError:
                break
        self.created = []


def live_driver(sweep_dir: Path) -> dict | None:
    """The driver that holds sweep_dir's lock now ({"pid", "host", "since"}, or {} if its file
    says nothing), None if no live driver does. For other folders only: a process that probes
    a lock it holds itself drops it when the probe closes (POSIX record locks)."""
    try:
        fd = os.open(Path(sweep_dir) / LOCK_FILE, os.O_RDWR)
    except OSError:
        return None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return _read_holder(fd) or {}
            holder = read_holder(fd)  # no record locks on this filesystem: trust the text where it can be checked
            if holder and not (holder.get("host") == socket.gethostname() and not _alive(holder.get("pid"))):
                return holder
        return None
    finally:
        os.close(fd)


def _read_holder(fd: int, wait: float = 2.0) -> dict | None:
    """The text of a lock another process holds. It writes its text just after taking the lock,
    so a reader that lost the race by microseconds may find the file empty or half-written:
    read again for up to `wait` seconds before saying it gives no pid."""
    deadline = time.monotonic() + wait
    while True:
        holder = read_holder(fd)
        if holder or time.monotonic() >= deadline:
            return holder
        time.sleep(0.02)


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True  # another user's process, or no pid to check: assume it runs
    return True
