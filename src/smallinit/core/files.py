"""Atomic writes: a kill at any moment leaves either the old file or the new one, never a
truncated one (write to a temporary file in the same folder, fsync, then rename)."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call write(f) on a temporary binary file beside path, then rename it onto path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), _mode())  # mkstemp makes 0600; a shared sweep folder needs the umask's mode
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if disk_full(e):  # say which file: torch's own message names none ("unexpected pos ...")
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from e
        raise


def _mode() -> int:
    """0666 less the process's umask: what open() would have given a new file. Read from
    /proc (Linux) where it can be: os.umask can only be read by setting it, which would open a
    window where another thread's new files get no mask."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def disk_full(e: BaseException | None) -> bool:
    """e, or what it was raised while handling, is a full disk or quota."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        e = e.__cause__ or e.__context__
    return False


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, default=str).encode()))
