"""Checkpoints: written atomically (core.files), read back only by the trial they belong to."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a checkpoint is written: the sweep driver only writes JSON
    import torch

from core.files import atomic_write


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    import torch

    atomic_write(path, lambda f: torch.save(state, f))


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
