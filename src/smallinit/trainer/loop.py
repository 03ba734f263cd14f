"""One trial: build the model, train it, evaluate and probe on a cadence, checkpoint, resume.

Outputs in the trial folder (core.trial_dir.TrialDir names them): trial.json, metrics.jsonl,
probes/, checkpoint.pt (checkpoint.dcp/ from several workers; removed when done),
per_token_losses.npz, model.pt and, last, result.json, whose presence means the trial finished.

With train.budgets (trainer/schedule.py) the run is the largest budget's, and at each smaller
budget's fork step it takes a side trip: it checkpoints the stable state, trains that budget's
cooldown, evaluates as a trial's final evaluation does, writes budgets/<tokens>.json, and puts
the stable state back. metrics.jsonl, probes/ and the per-token losses follow the main run only.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smallinit.core import provenance
from smallinit.core.trial_dir import TrialDir, unusable
from smallinit.model import Transformer, run_probes

from .checkpoint import save_checkpoint
from .config import TrialConfig, flops_per_token
from .distributed import Single
from .host_memory import retain_freed_memory
from .precision import autocast_for, resolve_dtype
from .reporting import JsonlReporter, MultiReporter, Reporter, Timer
from .schedule import Branch, branch_lr_at, budget_branches, budget_warmup, lr_at
from .tasks import make_task

# Reading the loss on the host every step makes a GPU wait for its queue to drain; on an
# accelerator the loss (and the gradient norm) stay on the device and are read every
# ACCEL_SYNC_EVERY steps, at every log step and before every checkpoint (so no checkpoint
# holds weights that a NaN already reached). On the CPU reading is free: every step.
ACCEL_SYNC_EVERY = 16


class ForeignFolder(RuntimeError):
    """out_dir holds another trial's result or checkpoint: nothing is trained over it."""


class FolderRemoved(RuntimeError):
    """The trial's folder was removed (or emptied) while it trained: what it would write next has
    no trial.json to belong to, so it stops rather than leave a result nobody can read."""


class TrialDiverged(RuntimeError):
    """The loss became NaN or inf; the trial stops instead of burning its budget."""


@dataclass
class TrialResult:
    identity: str
    steps: int
    tokens: int
    n_params: int
    final_val_loss: float | None
    best_val_loss: float | None
    unigram_entropy: float | None
    wall_s: float
    tokens_per_s: float
    mfu: float | None
    dtype: str = "fp32"  # what train.dtype resolved to on the machine that ran it
    corpus_tokens: int | None = None  # training tokens of the corpus: passes = tokens / corpus_tokens
    final_metrics: dict[str, float] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    # With train.budgets: the budget this result is for (result.json: the largest); else None.
    budget_tokens: int | None = None
    # What made it (core.provenance.record: commit, package versions, CPU model and flags, threads).
    # One identity on two CPUs is not bit-identical (their kernels round differently) and the
    # difference grows with the steps, so a result names the machine it came from.
    made_by: dict[str, Any] | None = None


# Dense bf16 peak FLOP/s of common accelerators, for MFU.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def peak_flops(trial: TrialConfig, device: torch.device) -> float | None:
    if trial.train.peak_tflops:
        return trial.train.peak_tflops * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    return None


def make_optimizer(model: torch.nn.Module, optim) -> torch.optim.AdamW:
    # Decay matrices (and the embedding); norm gains and biases are left alone.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device='cuda' but no CUDA device is visible: use train.device=auto or cpu")
    return torch.device(name)


def _is_heatmap_step(step: int, total: int, every: int) -> bool:
    """Keep cosine matrices at step 0, log-spaced probe steps and the end."""
    if step in (0, total):
        return True
    k = step // every
    return step % every == 0 and (k & (k - 1)) == 0


def run_trial(trial: TrialConfig, out_dir: Path, reporter: Reporter | None = None, log=print, prepared=None,
              dist=None) -> TrialResult:
    """Train one trial into out_dir, resuming from its checkpoint if one is there. `dist` is
    this process's part of a multi-process trial (trainer/distributed.py): every rank trains,
    rank 0 alone evaluates, probes and writes the folder; None is one process."""
    dist = dist or Single()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = TrialDir(out_dir)
    t, identity = trial.train, trial.identity(dist.world)  # N > 1 workers: their own trial
    finished = folder.read_result()
    if finished is not None:
        if finished["identity"] != identity:
            raise ForeignFolder(_not_this_trial(out_dir, "finished trial", finished["identity"], trial, dist.world))
        log(f"trial {identity} already finished in {out_dir}")
        return TrialResult(**finished)
    if t.threads:
        torch.set_num_threads(t.threads)
    # A checkpoint of another trial (this one on another worker count, most often) is refused
    # before trial.json is rewritten: the folder stays that trial's, to finish where it began.
    # Rank 0 reads, every rank raises the same line.
    refused = dist.share(_foreign_checkpoint(folder, trial, dist.world) if dist.is_main else None)
    if refused:
        raise ForeignFolder(refused)
    if dist.is_main:
        folder.write_trial(identity, trial.to_dict(), dist.world)
    made_by = {**provenance.record(), "threads": torch.get_num_threads(), "workers": dist.world} if dist.is_main else None
    device = resolve_device(t.device) if dist.world == 1 else dist.device
    precision = resolve_dtype(device, t.dtype)
    log(f"dtype: {precision.dtype} ({precision.reason})")
    if device.type == "cpu":
        log(f"host allocator: {retain_freed_memory()}")
    autocast = autocast_for(device, precision.dtype)
    task = make_task(trial, log=log, prepared=prepared)

    model = Transformer(trial.model).to(device)
    step_model = dist.wrap(model)  # the model itself, or its DDP wrapper (FSDP shards it in place)
    optimizer = make_optimizer(model, trial.optim)
    total = t.total_steps
    # With budgets the main run is the largest budget's branch; the others fork off it.
    branches = budget_branches(t.budgets, t.tokens_per_step, t.cooldown_frac) if t.budgets else []
    warmup = budget_warmup(branches, trial.optim) if branches else 0
    main = max(branches, key=lambda b: b.steps) if branches else None
    side = [b for b in branches if b is not main]

    def lr_for(step: int) -> float:
        return branch_lr_at(step, main, warmup, trial.optim) if main else lr_at(step, total, trial.optim)

    start, best, prior_wall, prior_train = 0, None, 0.0, 0.0
    state = dist.resume(folder, identity, step_model, optimizer, device, log)  # loaded; its step and timers here
    if state is not None:
        start, best = state["step"], state["best_val_loss"]
        prior_wall, prior_train = state["wall_s"], state["train_s"]
    # Rank 0 reads the budget files (and sets a bad one aside); every rank follows its word.
    budgets_done, restart = dist.share(_budgets_done(folder, side, identity, state, log) if dist.is_main else None)
    if restart:  # past the fork of a branch with no result of its own: only a run from step 0 goes through it
        if dist.is_main:
            folder.drop_checkpoint()
        model = Transformer(trial.model).to(device)  # init.seed: the same weights the first start drew
        step_model, optimizer = dist.wrap(model), make_optimizer(model, trial.optim)
        state, start, best, prior_wall, prior_train = None, 0, None, 0.0, 0.0
    if state is not None:
        note = f" (budgets done: {', '.join(str(b) for b in sorted(budgets_done))})" if budgets_done else ""
        log(f"resuming {identity} from step {start}/{total}{note}")
    jsonl = JsonlReporter(folder.metrics, resume_step=start if state is not None else None) if dist.is_main else None
    report = MultiReporter(jsonl, reporter)
    fwd = torch.compile(step_model) if t.compile else step_model
    probe_idx = task.probe_idx.to(device)
    flops_tok, peak = flops_per_token(trial), peak_flops(trial, device)
    if dist.is_main:
        folder.probes.mkdir(exist_ok=True)

    def check_folder() -> None:  # every rank raises together, or none does
        gone = dist.share(_folder_gone(folder, identity) if dist.is_main else None)
        if gone:
            raise FolderRemoved(gone)

    def checkpoint(step: int) -> None:
        check_folder()
        dist.save(folder, step_model, optimizer, {
            "identity": identity, "step": step, "best_val_loss": best, "wall_s": prior_wall + time.perf_counter() - t0,
            "train_s": prior_train + timer.elapsed, "budgets_done": sorted(budgets_done),
        })

    def train_step(step: int, lr: float, pending: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step at lr; adds its micro-batches' losses to pending. Returns the
        gradient norm before clipping (None without clipping)."""
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro in range(t.grad_accum):
            x, y = dist.local(*task.train_batch(step * t.grad_accum + micro))
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast():
                logits, aux = fwd(x, return_aux=True)
                loss = task.loss(logits, y) + trial.model.ffn.aux_loss_coef * aux
            (loss / t.grad_accum).backward()
            pending += loss.detach().float()
            if sync_every == 1:  # the CPU: catch a NaN before the optimizer step uses it
                _check_finite(dist.mean(pending), step + 1, step + 1)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), trial.optim.grad_clip) if trial.optim.grad_clip else None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def run_branch(branch: Branch) -> None:
        """Train branch's cooldown from the stable state at its fork, evaluate it as the final
        evaluation of a trial does, and write budgets/<tokens>.json."""
        b0, pending, loss_sum, last_read = time.perf_counter(), torch.zeros((), device=device), 0.0, branch.fork
        for step in range(branch.fork, branch.steps):
            lr = branch_lr_at(step, branch, warmup, trial.optim)
            train_step(step, lr, pending)
            if (step + 1) % sync_every == 0 or step + 1 == branch.steps:
                loss_sum += _check_finite(dist.mean(pending), last_read + 1, step + 1)
                pending.zero_()
                last_read = step + 1
        metrics = {"train/loss": loss_sum / (branch.cooldown * t.grad_accum), "train/lr": lr,
                   "tokens": branch.steps * t.tokens_per_step}
        whole = dist.full_model(model)  # every rank calls it (FSDP gathers); rank 0 evaluates
        if dist.is_main:
            whole.eval()
            metrics.update(task.evaluate(fwd if dist.world == 1 else whole, device, autocast))
            whole.train()
            if t.probe_every:
                metrics.update(run_probes(whole, probe_idx).scalars)
        metrics = dist.share(metrics)
        val = metrics.get("val/loss")
        wall = time.perf_counter() - b0
        tok_s = branch.cooldown * t.tokens_per_step / max(wall, 1e-9)
        # best_val_loss: over the stable evaluations up to the fork and the branch's end.
        result = TrialResult(
            identity=identity, steps=branch.steps, tokens=branch.steps * t.tokens_per_step, n_params=model.num_params(),
            final_val_loss=val, best_val_loss=min(v for v in (best, val) if v is not None) if val is not None else best,
            unigram_entropy=task.unigram_entropy, corpus_tokens=task.corpus_tokens, wall_s=wall, tokens_per_s=tok_s,
            mfu=(tok_s * flops_tok / peak) if peak else None, dtype=precision.dtype, final_metrics=metrics,
            budget_tokens=branch.tokens, made_by=made_by,
        )
        if dist.is_main:
            folder.write_budget_result(branch.tokens, asdict(result))
        budgets_done.add(branch.tokens)
        log(f"budget {branch.tokens:,} tokens: val loss {val} (cooldown steps {branch.fork}-{branch.steps}, {wall:.1f} s)")

    def fork(step: int) -> None:
        """The side trips that fork at step: each from the same stable state, put back after."""
        todo = [b for b in side if b.fork == step and b.tokens not in budgets_done]
        if not todo:
            return
        checkpoint(step)  # the stable state: a kill during a branch resumes from its fork
        stable = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
        rng = torch.get_rng_state()  # nothing in a step draws from it today; kept so nothing can drift
        for branch in todo:
            run_branch(branch)
            model.load_state_dict(stable["model"])
            # A copy each time: the optimizer keeps the tensors it is given and updates them in place.
            optimizer.load_state_dict(copy.deepcopy(stable["optimizer"]))
            torch.set_rng_state(rng)

    def observe(step: int, train_stats: dict[str, float]) -> dict[str, float]:
        nonlocal best
        metrics = dict(train_stats)
        evaluate = step % t.eval_every == 0 or step == total
        probe = t.probe_every and (step % t.probe_every == 0 or step == total)
        whole = dist.full_model(model) if evaluate or probe else None  # every rank calls it (FSDP gathers)
        if evaluate:
            if dist.is_main:
                whole.eval()
                metrics.update(task.evaluate(fwd if dist.world == 1 else whole, device, autocast))
                whole.train()
            metrics = dist.share(metrics)  # every rank reports each evaluation (Ray Train's report is collective)
            if "val/loss" in metrics:
                best = metrics["val/loss"] if best is None else min(best, metrics["val/loss"])
                metrics["val/best_loss"] = best
        if probe and dist.is_main:
            probes = run_probes(whole, probe_idx)
            metrics.update(probes.scalars)
            if _is_heatmap_step(step, total, t.probe_every):
                np.savez_compressed(folder.probe_snapshot(step),
                                    **{k: v.numpy().astype(np.float16) for k, v in probes.cosine_matrices.items()})
        if len(metrics) > len(train_stats) or "train/loss" in metrics:
            report.log(step, metrics)
        return metrics

    t0, timer = time.perf_counter(), Timer()
    model.train()
    last: dict[str, float] = {}
    if start == 0:
        last = observe(0, {"tokens": 0})
    sync_every = _sync_every(device)
    loss_sum, loss_n, interval_start = 0.0, 0, timer.elapsed
    pending = torch.zeros((), device=device)  # losses summed on the device since the last read
    grad_norm_t = torch.full((), float("nan"), device=device)
    last_read = start
    try:
        if start > 0:
            fork(start)  # killed during a side trip: its checkpoint is the fork's stable state
        for step in range(start, total):
            with timer:
                lr = lr_for(step)
                norm = train_step(step, lr, pending)
                grad_norm_t = grad_norm_t if norm is None else norm
                loss_n += t.grad_accum
            done = step + 1
            due = (done % t.eval_every == 0 or done == total or (t.probe_every and done % t.probe_every == 0)
                   or (t.log_every and done % t.log_every == 0))
            ckpt_due = t.ckpt_every and done % t.ckpt_every == 0 and done < total
            if due or ckpt_due or done % sync_every == 0:
                loss_sum += _check_finite(dist.mean(pending), last_read + 1, done)
                pending.zero_()
                last_read = done
            if due:
                grad_norm = float(grad_norm_t.full_tensor() if hasattr(grad_norm_t, "full_tensor") else grad_norm_t)
                interval = timer.elapsed - interval_start
                steps_in_interval = loss_n / t.grad_accum
                tok_s = steps_in_interval * t.batch_size * t.seq_len * t.grad_accum / max(interval, 1e-9)
                stats = {"train/loss": loss_sum / loss_n, "train/lr": lr, "train/grad_norm": grad_norm,
                         "tokens": done * t.tokens_per_step, "perf/tokens_per_s": tok_s}
                if peak:
                    stats["perf/mfu"] = tok_s * flops_tok / peak
                last = observe(done, stats)
                loss_sum, loss_n, interval_start = 0.0, 0, timer.elapsed
            if ckpt_due:
                checkpoint(done)
            fork(done)
        check_folder()
        whole = dist.full_model(model)
        per_token = task.per_token_losses(whole.eval(), device, autocast) if dist.is_main else {}  # the main run's (largest budget's) model
        if per_token:
            np.savez_compressed(folder.per_token_losses, **per_token)
        # Done: keep the final weights (for later analysis), drop the optimizer state, which
        # is twice their size and only ever needed to resume.
        if dist.is_main:
            save_checkpoint(folder.model_weights, {"identity": identity, "step": total, "model": whole.state_dict()})
    finally:
        report.close()

    tokens = total * t.tokens_per_step
    tok_s = (total - start) * t.tokens_per_step / max(timer.elapsed, 1e-9) if total > start else float("nan")
    result = TrialResult(
        identity=identity, steps=total, tokens=tokens, n_params=model.num_params(),
        final_val_loss=last.get("val/loss"), best_val_loss=best, unigram_entropy=task.unigram_entropy,
        corpus_tokens=task.corpus_tokens,
        wall_s=prior_wall + time.perf_counter() - t0, tokens_per_s=tok_s,
        mfu=(tok_s * flops_tok / peak) if peak else None, dtype=precision.dtype, final_metrics=last,
        artifacts=folder.artifacts(per_token_losses=bool(per_token)) if dist.is_main else {}, budget_tokens=main.tokens if main else None,
        made_by=made_by,
    )
    if not dist.is_main:
        return result
    if main:
        folder.write_budget_result(main.tokens, asdict(result))
    folder.write_result(asdict(result))
    folder.drop_checkpoint()  # after result.json: a kill in between still resumes
    return result


def _not_this_trial(out_dir: Path, what: str, other: str, trial: TrialConfig, world: int) -> str:
    """The one line refusing a folder that holds `what` of trial `other`, not of this trial on
    `world` workers; when `other` is this trial on another worker count, it says so."""
    identity, workers = trial.identity(world), trial.workers_of(other)
    if workers is None:
        return f"{out_dir} holds {what} {other}, not {identity}: use another folder"
    return (f"{out_dir} holds {what} {other}, this trial on {_count(workers)}, not {identity} on "
            f"{_count(world)}: a trial's worker count is part of its identity (docs/sweeps.md); run it "
            f"there on {_count(workers)}, or use another folder")


def _folder_gone(folder: TrialDir, identity: str) -> str | None:
    """Why folder is no longer this trial's (its trial.json removed or replaced), or None."""
    meta = folder.read_trial(damaged_ok=True)
    if meta is not None and meta.get("identity") == identity:
        return None
    what = "its trial.json is gone" if meta is None else f"its trial.json now names {meta.get('identity')}"
    return (f"{folder.path} was removed or replaced while the trial trained ({what}): this run's work is not "
            "kept; rerun the command to train the trial again")


def _count(workers: int) -> str:
    return "1 worker" if workers == 1 else f"{workers} workers"


def _foreign_checkpoint(folder: TrialDir, trial: TrialConfig, world: int) -> str | None:
    """Why folder's checkpoint cannot be resumed here: trial.json says it is another trial's;
    None without a checkpoint or with this trial's (a damaged one is set aside when read)."""
    record = folder.read_trial(damaged_ok=True)
    other = record.get("identity") if isinstance(record, dict) else None
    if not folder.has_checkpoint or not isinstance(other, str) or other == trial.identity(world):
        return None
    return _not_this_trial(folder.path, "a checkpoint of trial", other, trial, world)


def _budgets_done(folder: TrialDir, side: list[Branch], identity: str, state: dict | None, log) -> tuple[set[int], bool]:
    """(the budgets whose branch already ran, whether the run must start again from step 0).
    A branch ran when its budgets/<tokens>.json is whole and this trial's <tokens> branch: the
    file is what the table reports, so the checkpoint's list (written after it) only says which
    to expect. A damaged or foreign file is set aside and named in one line; its branch runs
    again at its fork, or, when the checkpoint is past that fork (the stable state there is
    gone), the trial trains again from step 0 rather than finish without that budget."""
    step = state["step"] if state is not None else 0
    listed = set(state.get("budgets_done", ())) if state is not None else set()
    done, restart = set(), False
    for b in side:
        path, why = folder.budget_json(b.tokens), folder.damaged_budget(b.tokens, identity)
        if why is None and path.exists():
            done.add(b.tokens)
            continue
        if why is None and b.tokens not in listed and b.fork >= step:
            continue  # not reached yet
        what = f"{path} is missing"
        if why is not None:
            what = f"{path} is {unusable(why)}: set aside as {folder.set_aside_budget(b.tokens).name}"
        if b.fork < step:
            restart = True
            log(f"{what}; the checkpoint (step {step}) is past its fork (step {b.fork}): training the trial "
                "again from step 0")
        else:
            log(f"{what}; the {b.tokens}-token branch runs again at its fork (step {b.fork})")
    return done, restart


def _sync_every(device: torch.device) -> int:
    return 1 if device.type == "cpu" else ACCEL_SYNC_EVERY


def _check_finite(pending: torch.Tensor, first: int, last: int) -> float:
    """The summed losses of steps first..last, read to the host; raises if any was NaN or inf."""
    value = float(pending)
    if not math.isfinite(value):
        where = f"step {last}" if first == last else f"a step in {first}-{last} (read every {last - first + 1})"
        raise TrialDiverged(f"diverged at {where}: loss={value}")
    return value
