"""The baseline: a bare torch training loop with nothing but the training.

Same model (built and initialised by `Transformer`, so the same weights), the same batches
(`TrainBatches`, same seed), AdamW with the same parameter groups and hyperparameters, the
same warmup/decay schedule (`lr_at`), gradient clipping and accumulation, the same autocast.
No evaluation, probes, metrics, checkpoints, outputs or per-step `.item()`.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from smallinit.data.pipeline import TrainBatches
from smallinit.model import Transformer
from smallinit.trainer.loop import lr_at, make_optimizer
from smallinit.trainer.machine.compile_choice import compile_model
from smallinit.trainer.machine.host_memory import retain_freed_memory
from smallinit.trainer.machine.precision import autocast_for, resolve_device, resolve_dtype


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(trial, data, steps: int | None = None, compile: bool = False, warmup: int = 0) -> dict[str, float]:
    """Train `trial` for `steps` (default: its whole budget). Returns wall_s (model build to
    last step, the work any training script has to do), steps_s (the steps alone), tokens.
    compile: through torch.compile (the reference a compiled trainer is held to); warmup: steps
    trained before steps_s starts (compilation, kernel choice), counted in wall_s only."""
    t, o = trial.train, trial.optim
    total = t.total_steps
    steps = total if steps is None else steps
    device = resolve_device(t.device)
    autocast = autocast_for(device, resolve_dtype(device, t.dtype).dtype)
    if device.type == "cpu":  # the trainer's allocator setting: both sides in the same process state
        retain_freed_memory()
    t0 = time.perf_counter()
    model = Transformer(trial.model).to(device)
    optimizer = make_optimizer(model, o)
    batches = TrainBatches(data.train_tokens(), t.batch_size, t.seq_len, t.seed)
    model.train()
    forward = compile_model(model) if compile else model
    t1 = None
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            t1 = time.perf_counter()
        lr = lr_at(step, total, o)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro in range(t.grad_accum):
            x, y = batches.batch(step * t.grad_accum + micro)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast():
                logits = forward(x)  # (B, T, V)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            (loss / t.grad_accum).backward()
        if o.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    t2 = time.perf_counter()
    t1 = t2 if t1 is None else t1
    return {"wall_s": t2 - t0, "steps_s": t2 - t1, "tokens": steps * t.tokens_per_step,
            "final_loss": float(loss.detach())}
