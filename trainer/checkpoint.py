"""Atomic writes: a kill at any moment leaves either the old file or the new one, never a
truncated one (write to a temporary file in the same folder, fsync, then rename)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a checkpoint is written: the sweep driver only writes JSON
    import torch


def _atomic_write(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    _atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, default=str).encode()))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    import torch

    _atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path, identity: str, device: torch.device) -> dict[str, Any] | None:
    """The checkpoint's state if it belongs to this trial (same identity), else None."""
    path = Path(path)
    if not path.exists():
        return None
    import torch

    state = torch.load(path, map_location=device, weights_only=False)
    if state.get("identity") != identity:
        raise RuntimeError(
            f"{path} belongs to trial {state.get('identity')}, not {identity}: use another output folder"
        )
    return state
