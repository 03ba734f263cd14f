"""Checkpoints: written atomically (core.files), read back only by the trial they belong to."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a checkpoint is written: the sweep driver only writes JSON
    import torch

from core.errors import first_line
from core.files import atomic_write

# Errors that say the machine is at fault, not the file: the checkpoint is left in place.
_NOT_THE_FILE = (errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    import torch

    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path, identity: str, device: torch.device, log=print) -> dict[str, Any] | None:
    """The checkpoint's state if it belongs to this trial (same identity); None if there is
    none, or if it cannot be read: then it is set aside (renamed, kept) and the trial starts
    from step 0, rather than failing on it at every attempt."""
    path = Path(path)
    if not path.exists():
        return None
    import torch

    try:
        state = torch.load(path, map_location=device, weights_only=False)
        if not isinstance(state, dict):
            raise ValueError(f"holds a {type(state).__name__}, not a checkpoint")
    except Exception as e:  # noqa: BLE001 - truncated, not a zip (torch: OSError EINVAL), not a pickle
        if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno in _NOT_THE_FILE):
            raise  # the file may be fine: the machine is not
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(aside)
        log(f"{path} is unreadable ({type(e).__name__}: {first_line(e)}); set aside as {aside.name}, "
            "training from step 0")
        return None
    if state.get("identity") != identity:
        raise RuntimeError(
            f"{path} belongs to trial {state.get('identity')}, not {identity}: use another output folder"
        )
    return state
