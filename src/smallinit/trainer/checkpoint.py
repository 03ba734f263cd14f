"""Checkpoints: written atomically (core.files), read back only by the trial they belong to.

One process writes checkpoint.pt whole. A trial trained by several workers writes
checkpoint.dcp/ (core.trial_dir names both): every rank its own shard through
torch.distributed.checkpoint (DCP), rank 0 the scalars, into checkpoint.dcp.new/, which rank 0
then swaps in. DCP reshards a sharded checkpoint for the ranks that load it, and one process
reads it too; but a checkpoint carries its trial's identity, which holds the worker count
above 1, so it resumes only under the worker count that wrote it (trainer/loop.py says so).
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a checkpoint is written: the sweep driver only writes JSON
    import torch

    from smallinit.core.trial_dir import TrialDir

from smallinit.core.errors import ConfigError, first_line
from smallinit.core.files import atomic_write, atomic_write_json

# Errors that say the machine is at fault, not the file: the checkpoint is left in place.
_NOT_THE_FILE = (errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE)

# In checkpoint.dcp/: identity, step, best_val_loss, wall_s, train_s, budgets_done. Written last,
# so a folder that holds it is whole.
SCALARS = "scalars.json"


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
        _set_aside(path, e, log)
        return None
    _check_identity(path, state, identity)
    return state


def write_shard(folder: TrialDir, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank: its part of the model and optimizer into checkpoint.dcp.new/ (FSDP: its
    shards; DDP: the replicas, which DCP writes once). dcp.save ends in a collective in which
    rank 0 writes DCP's metadata after every rank's shard: when it returns, all are on disk."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # sharded (full_state_dict=False)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder.checkpoint_dcp_new)


def commit_sharded(folder: TrialDir, scalars: dict[str, Any]) -> None:
    """Rank 0, after write_shard: the scalars into checkpoint.dcp.new/, then that folder in place
    of checkpoint.dcp/. A folder cannot be renamed onto a full one, so the old one steps aside
    first; a kill between the two renames leaves both whole, and read_sharded takes the new one."""
    new, path, old = folder.checkpoint_dcp_new, folder.checkpoint_dcp, folder.checkpoint_dcp_old
    atomic_write_json(new / SCALARS, scalars)
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    new.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def read_sharded(folder: TrialDir, identity: str, log=print) -> dict[str, Any] | None:
    """Rank 0 (or one process), before any rank loads a tensor: checkpoint.dcp's scalars if it
    belongs to this trial; None if there is none or it cannot be read, and then it is set aside
    as load_checkpoint does. Read means: the scalars, DCP's metadata, and every shard file the
    metadata names at least as long as it says (cut off by a full disk or a copy)."""
    path, new, old = folder.checkpoint_dcp, folder.checkpoint_dcp_new, folder.checkpoint_dcp_old
    if not path.exists():  # a swap cut between its renames (commit_sharded)
        whole = new if (new / SCALARS).exists() else old
        if whole.exists():
            whole.rename(path)
    for stale in (new, old):  # a save a kill cut short, or an old folder not yet removed
        shutil.rmtree(stale, ignore_errors=True)
    if not path.exists():
        return None
    try:
        scalars = json.loads((path / SCALARS).read_text())
        if not isinstance(scalars, dict):
            raise ValueError(f"{SCALARS} holds a {type(scalars).__name__}, not the checkpoint's scalars")
        from torch.distributed.checkpoint import FileSystemReader

        for info in FileSystemReader(path).read_metadata().storage_data.values():
            size = (path / info.relative_path).stat().st_size
            if size < info.offset + info.length:
                raise ValueError(f"{info.relative_path} holds {size} bytes, its metadata {info.offset + info.length}")
    except Exception as e:  # noqa: BLE001 - missing, cut off, not JSON, not DCP's pickle
        _set_aside(path, e, log)
        return None
    _check_identity(path, scalars, identity)
    return scalars


def load_sharded(folder: TrialDir, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank (or one process), after read_sharded: checkpoint.dcp into the model and the
    optimizer as they are split here, whatever worker count or train.parallel wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # The tensors to load into. An optimizer that has not stepped gets its state here, from a
    # step at lr 0: the load overwrites all of it, its step count included.
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process: expected
        dcp.load(state, checkpoint_id=folder.checkpoint_dcp)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _set_aside(path: Path, e: Exception, log) -> None:
    """Rename an unreadable checkpoint beside itself (kept), or re-raise when the machine, not
    the checkpoint, is at fault."""
    if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno in _NOT_THE_FILE):
        raise e  # the file may be fine: the machine is not
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    path.rename(aside)
    log(f"{path} is unreadable ({type(e).__name__}: {first_line(e)}); set aside as {aside.name}, "
        "training from step 0")


def check_weights_owner(path: Path, state: dict[str, Any], identity: str | None, record: Path, log=None) -> None:
    """model.pt carries the identity of the trial that wrote it (trainer/loop.py saves it with
    the weights): another trial's model.pt copied into a folder is refused, not read as this
    trial's. One without an identity (written by hand, or by an older tool) is taken on the
    word of `record` (trial.json), with a one-line note saying so."""
    owner = state.get("identity")
    if owner is None:
        (log or (lambda m: print(m, file=sys.stderr)))(
            f"note: {path} records no trial identity: taken as trial {identity}, as {record} says, unchecked")
    elif owner != identity:
        raise ConfigError(f"{path} holds trial {owner}'s weights, but {record} is trial {identity}: nothing "
                          f"exported; put trial {identity}'s model.pt there, or export trial {owner}'s own folder")


def _check_identity(path: Path, state: dict[str, Any], identity: str) -> None:
    if state.get("identity") != identity:
        raise RuntimeError(
            f"{path} belongs to trial {state.get('identity')}, not {identity}: use another output folder"
        )
