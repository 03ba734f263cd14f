"""One trial on several processes: data parallel (DDP) or sharded (FSDP2), under an already
initialised torch.distributed process group (Ray Train's TorchTrainer sets it up: gloo on the
CPU, nccl on GPUs).

The loop (trainer/loop.py) asks a `Single` or a `Parallel` for the few things that differ:
which rows of the global batch this rank trains on, the loss averaged over ranks, the whole
model for evaluation, probes and model.pt (on rank 0 only), and the checkpoint: checkpoint.pt
from one process, a shard per rank in checkpoint.dcp/ from several (trainer/checkpoint.py). A
`Single` does what the one-process loop always did, so that path is unchanged to the bit.

Every rank draws the same global batch (train.batch_size rows, a pure function of seed and
step) and trains on its contiguous slice; each rank's loss is the mean over its rows and
DDP/FSDP average the gradients, so the update is the global batch's mean gradient, as on one
process, up to float summation order. That order is not one process's, and over hundreds of
steps the difference grows to the size of a seed's (docs/sweeps.md measures it), so a trial
on N > 1 workers is its own trial: the worker count is part of its identity
(TrialConfig.identity), and a checkpoint resumes only under the worker count that wrote it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .checkpoint import (
    commit_sharded,
    load_checkpoint,
    load_sharded,
    read_sharded,
    save_checkpoint,
    write_shard,
)
from .config import PARALLEL

if TYPE_CHECKING:  # torch is imported where training runs: the sweep driver checks a split without it
    import torch

    from smallinit.core.trial_dir import TrialDir

    from .config import TrialConfig


class Single:
    """One process: every method hands back what the one-process loop used."""

    rank, world, is_main = 0, 1, True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def local(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, y

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def share(self, obj: Any) -> Any:
        return obj

    def full_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def save(self, folder: TrialDir, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scalars: dict) -> None:
        save_checkpoint(folder.checkpoint, {**scalars, "model": model.state_dict(), "optimizer": optimizer.state_dict()})
        folder.drop_sharded_checkpoint()  # several workers' older checkpoint, if this trial had one

    def resume(self, folder: TrialDir, identity: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               device: torch.device, log) -> dict | None:
        """The checkpoint's state, loaded into model and optimizer; None without one. A sharded
        checkpoint is read too (it is several workers', so another trial's: refused by identity)."""
        state = load_checkpoint(folder.checkpoint, identity, device, log=log)
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            return state
        scalars = read_sharded(folder, identity, log=log)
        if scalars is not None:
            load_sharded(folder, model, optimizer)
        return scalars


class Parallel:
    """This process's part of a trial trained by `world` ranks with DDP or FSDP2."""

    def __init__(self, kind: str, device: torch.device):
        import torch.distributed as dist

        if kind not in PARALLEL:
            raise ValueError(f"train.parallel={kind!r} is invalid: one of {list(PARALLEL)}")
        if not dist.is_initialized():
            raise RuntimeError("Parallel needs an initialised torch.distributed process group (Ray Train's TorchTrainer)")
        self.kind, self.device = kind, device
        if device.type == "cuda":  # FSDP2's mesh and nccl's streams use the current device
            import torch

            torch.cuda.set_device(device)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self._whole: torch.nn.Module | None = None  # rank 0's unsharded copy, under fsdp

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the training step calls. DDP wraps it; FSDP2 shards each block and then
        the root (embedding, final norm, head) in place, as torchtitan does."""
        if self.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            # The only buffers are the RoPE tables, the same on every rank: no need to send them
            # at each forward.
            ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model

    def local(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous rows of the global batch (the batch size divides: compose.py)."""
        rows = x.shape[0] // self.world
        lo = self.rank * rows
        return x[lo: lo + rows], y[lo: lo + rows]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean over ranks of a scalar (each rank's loss is over equally many rows)."""
        import torch.distributed as dist

        out = value.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / self.world

    def share(self, obj: Any) -> Any:
        """Rank 0's object on every rank (metrics after an evaluation, the checkpoint's step)."""
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def full_model(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The whole model on rank 0, None elsewhere. Under FSDP every rank must call it (it
        gathers the shards into a plain copy that rank 0 keeps between calls)."""
        if self.kind == "ddp":
            return model if self.is_main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.is_main:
            return None
        if self._whole is None:
            from smallinit.model import Transformer

            self._whole = Transformer(model.cfg).to(self.device)
        self._whole.load_state_dict(full)
        return self._whole

    def save(self, folder: TrialDir, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scalars: dict) -> None:
        """Every rank writes its shard into checkpoint.dcp.new/; once all are written (write_shard
        returns then), rank 0 adds the scalars and swaps the folder in (trainer/checkpoint.py)."""
        write_shard(folder, model, optimizer)
        if self.is_main:
            commit_sharded(folder, scalars)
            folder.checkpoint.unlink(missing_ok=True)  # a one-process run's older checkpoint

    def resume(self, folder: TrialDir, identity: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               device: torch.device, log) -> dict | None:
        """The checkpoint's scalars on every rank, its tensors loaded; None without one. Rank 0
        checks it first (identity, whole, else set aside). checkpoint.dcp is read by every rank
        (DCP reshards it to the ranks that load it); a checkpoint.pt is read by rank 0 and
        broadcast. The identity holds the worker count (run_trial refuses another's first)."""
        found, state = None, None
        if self.is_main:
            scalars = read_sharded(folder, identity, log=log)
            if scalars is not None:
                found = ("sharded", scalars)
            else:
                state = load_checkpoint(folder.checkpoint, identity, device, log=log)
                if state is not None:
                    found = ("whole", {k: v for k, v in state.items() if k not in ("model", "optimizer")})
        found = self.share(found)
        if found is None:
            return None
        if found[0] == "sharded":
            load_sharded(folder, model, optimizer)
        else:
            self._load_whole(model, optimizer, state)
        return found[1]

    def _load_whole(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict | None) -> None:
        """Rank 0's checkpoint.pt (state; None elsewhere) broadcast into every rank's part."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        names = _param_names(model, optimizer)
        msd = state["model"] if self.is_main else {}
        osd = _by_name(state["optimizer"], names) if self.is_main else {}
        # Two calls, not set_state_dict: that one takes an empty model state (off rank 0) to
        # mean "optimizer only" and skips the model's broadcast there, leaving rank 0 waiting.
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, msd, options=options)
        set_optimizer_state_dict(model, optimizer, osd, options=options)


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimizer's parameters, in its order, by name (a DDP wrapper's `module.` dropped)."""
    inner = model.module if hasattr(model, "module") else model
    names = {id(p): n for n, p in inner.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _by_name(osd: dict, names: list[str]) -> dict:
    """Optimizer.state_dict()'s layout (parameters numbered in param_groups order) keyed by
    parameter name, as torch.distributed.checkpoint's set_optimizer_state_dict takes it."""
    return {"state": {names[i]: s for i, s in osd["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}


def check_split(trial: TrialConfig, workers: int) -> None:
    """A trial trained by `workers` processes: refused, in one line, when it cannot be split."""
    from smallinit.core.errors import require

    t = trial.train
    require(isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1,
            "ray.workers_per_trial", workers, "must be an integer >= 1")
    if workers == 1:
        return
    require(t.parallel in PARALLEL, "train.parallel", t.parallel, f"one of {list(PARALLEL)}")
    require(t.batch_size % workers == 0, "train.batch_size", t.batch_size,
            f"must be divisible by ray.workers_per_trial={workers} (each worker trains an equal share of the global batch)")
