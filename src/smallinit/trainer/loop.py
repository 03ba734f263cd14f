"""One trial: build the model, train it, evaluate and probe on a cadence, checkpoint, resume.

Outputs in the trial folder (core.trial_dir.TrialDir names them): trial.json, metrics.jsonl,
probes/, checkpoint.pt (checkpoint.dcp/ from several workers; removed when done),
per_token_losses.npz, model.pt and, last, result.json, whose presence means the trial finished.
With train.budgets, also budgets/<tokens>.json (trainer/schedule.py).

`run_trial` is the entry point; a `Trainer` does the work: set up in its constructor, trained
by `fit()`, whose loop reads as the order of events in a step. Evaluation, probes and the
reported rows are trainer/observer.py's; the budgets' cooldown branches trainer/schedule.py's.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smallinit.core import provenance, trial_files
from smallinit.core.trial_dir import TrialDir
from smallinit.model import Transformer

from .checkpoint import save_checkpoint
from .config import TrialConfig, flops_per_token
from .distributed import Single
from .folder_checks import (
    FolderRemoved,
    ForeignFolder,
    budgets_done,
    finished_result,
    folder_gone,
    foreign_checkpoint,
)
from .machine.compile_choice import RunCompiler
from .machine.compile_choice import shape_key as compile_shape
from .machine.host_memory import retain_freed_memory
from .machine.precision import autocast_for, resolve_device, resolve_dtype
from .observer import Measures, Observer
from .reporting import JsonlReporter, MultiReporter, Reporter, Timer
from .schedule import Branch, BudgetForks, hold, lr_at, put_back
from .tasks import make_task

# Reading the loss on the host every step makes a GPU wait for its queue to drain; on an
# accelerator the loss (and the gradient norm) stay on the device and are read every
# ACCEL_SYNC_EVERY steps, at every log step and before every checkpoint (so no checkpoint
# holds weights that a NaN already reached). On the CPU reading is free: every step.
ACCEL_SYNC_EVERY = 16


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
    # Every file the finished trial keeps, with its size and sha256 (core/trial_files.py): what
    # each reader holds the folder against. Last, so that result.json is written after the rest.
    files: dict[str, Any] = field(default_factory=dict)


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
    # The fused kernel does the whole update in one pass per tensor: at d = 128 on a CPU the
    # per-parameter loops of the default cost ~15% of a step. Sharded (DTensor) parameters keep
    # the default, which every torch version supports for them.
    fused = not any(hasattr(p, "full_tensor") for p in model.parameters())
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps, fused=fused or None)


def run_trial(trial: TrialConfig, out_dir: Path, reporter: Reporter | None = None, log=print, prepared=None,
              dist=None, identity: str | None = None) -> TrialResult:
    """Train one trial into out_dir, resuming from its checkpoint if one is there. `dist` is
    this process's part of a multi-process trial (trainer/distributed.py): every rank trains,
    rank 0 alone evaluates, probes and writes the folder; None is one process. `identity`: the
    trial's, as the caller computed it once (a sweep's driver: TrialSpec); None computes it here."""
    dist = dist or Single()
    identity = identity or trial.identity(dist.world)  # N > 1 workers: their own trial
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = TrialDir(out_dir)
    finished = finished_result(folder, trial, identity, dist.world, log)
    if finished is not None:
        return TrialResult(**finished)
    return Trainer(trial, folder, reporter, log, prepared, dist, identity).fit()


class LossMeter:
    """Training losses: summed on the device since the last read (`pending`), and on the host
    since the last logged row (`loss_sum`, over `micro_batches`)."""

    def __init__(self, device: torch.device, dist, start: int):
        self.dist = dist
        self.pending = torch.zeros((), device=device)
        self.loss_sum, self.micro_batches, self.last_read = 0.0, 0, start

    def read(self, step: int) -> None:
        """Moves the losses of the steps since the last read to the host; raises if one diverged."""
        self.loss_sum += _check_finite(self.dist.mean(self.pending), self.last_read + 1, step)
        self.pending.zero_()
        self.last_read = step


class Trainer:
    """One trial's training. The constructor sets it up (folder, device, data, model, optimizer,
    the checkpoint it resumes from); fit() trains to the end and writes the result. The concerns
    around the steps are parts of their own, each handed what it reads rather than the trainer:
    `observer` (evaluation, probes, the reported rows, trainer/observer.py; the model and its
    forward with each call) and `forks` (the budgets' plan, trainer/schedule.py; their side
    trips are trained here, with the steps); checkpoints and the check that the folder is still
    this trial's are methods here."""

    def __init__(self, trial: TrialConfig, folder: TrialDir, reporter: Reporter | None, log, prepared, dist,
                 identity: str):
        self.trial, self.folder, self.log, self.dist = trial, folder, log, dist
        t = trial.train
        self.identity, self.total = identity, t.total_steps
        self.made_by = self._claim_folder()
        self.device = resolve_device(t.device) if dist.world == 1 else dist.device
        self.precision = resolve_dtype(self.device, t.dtype)
        log(f"dtype: {self.precision.dtype} ({self.precision.reason})")
        if self.device.type == "cpu":
            log(f"host allocator: {retain_freed_memory()}")
        self.autocast = autocast_for(self.device, self.precision.dtype)
        self.task = make_task(trial, log=log, prepared=prepared)
        self._build_model()
        self.forks = BudgetForks(t, trial.optim)  # with budgets the main run is the largest budget's branch
        best = self._resume()
        self.sync_every = _sync_every(self.device)
        jsonl = JsonlReporter(folder.metrics, resume_step=self.start if self.resumed else None) if dist.is_main else None
        self.report = MultiReporter(jsonl, reporter)
        self.compiler = RunCompiler(t.compile, compile_shape(trial), dist, log)
        self.fwd = self.compiler.forward(self.step_model)
        self.probe_idx = self.task.probe_idx.to(self.device)
        self.flops_tok, self.peak = flops_per_token(trial), peak_flops(trial, self.device)
        if dist.is_main:
            folder.probes.mkdir(exist_ok=True)
        self.observer = Observer(Measures(t, self.total, dist, folder, self.report, self.task, self.device, self.autocast,
                                          self.probe_idx), best)

    def fit(self) -> TrialResult:
        """Train steps start..total: each step, then whatever is due after it (a logged row with
        its evaluation and probes, a checkpoint, the budget branches that fork there); then the
        final weights and the result."""
        t = self.trial.train
        self.t0, self.timer = time.perf_counter(), Timer()
        self.model.train()
        if self.start == 0:
            self.observer.observe(0, {"tokens": 0}, self.model, self.fwd)
        meter = LossMeter(self.device, self.dist, self.start)
        grad_norm = torch.full((), float("nan"), device=self.device)
        self.interval_start = self.timer.elapsed
        try:
            if self.start > 0:
                self.take_side_trips(self.start)  # killed during a side trip: its checkpoint is the fork's stable state
            for step in range(self.start, self.total):
                before = self.timer.elapsed
                with self.timer:
                    lr = self.lr_for(step)
                    norm = self.train_step(step, lr, meter.pending)
                    grad_norm = grad_norm if norm is None else norm
                    meter.micro_batches += t.grad_accum
                done = step + 1
                compiled = self.compiler.after_step(self.timer.elapsed - before, self.total - done, self.step_model)
                if compiled is not None:
                    self.fwd = compiled
                row_due, ckpt_due = self.observer.row_due(done), self.checkpoint_due(done)
                if row_due or ckpt_due or done % self.sync_every == 0:
                    meter.read(done)
                if row_due:
                    self.observer.observe(done, self.train_stats(done, lr, grad_norm, meter), self.model, self.fwd)
                if ckpt_due:
                    self.checkpoint(done)
                self.take_side_trips(done)
            per_token = self.save_final()
        finally:
            self.report.close()
        return self.finish(per_token)

    # ---- setup ----

    def _claim_folder(self) -> dict[str, Any] | None:
        """Refuses another trial's checkpoint, then writes trial.json; returns made_by (rank 0's)."""
        dist, t = self.dist, self.trial.train
        if t.threads:
            torch.set_num_threads(t.threads)
        # A checkpoint of another trial (this one on another worker count, most often) is refused
        # before trial.json is rewritten: the folder stays that trial's, to finish where it began.
        # Rank 0 reads, every rank raises the same line.
        refused = dist.share(foreign_checkpoint(self.folder, self.trial, dist.world, self.identity)
                             if dist.is_main else None)
        if refused:
            raise ForeignFolder(refused)
        if not dist.is_main:
            return None
        self.folder.write_trial(self.identity, self.trial.to_dict(), dist.world)
        return {**provenance.record(), "threads": torch.get_num_threads(), "workers": dist.world}

    def _build_model(self) -> None:
        self.model = Transformer(self.trial.model).to(self.device)  # init.seed: the same weights on every start
        self.step_model = self.dist.wrap(self.model)  # the model itself, or its DDP wrapper (FSDP shards it in place)
        self.optimizer = make_optimizer(self.model, self.trial.optim)

    def _resume(self) -> float | None:
        """Loads this trial's checkpoint, if any, and sets start, the timers so far and
        forks.done; returns the best validation loss so far."""
        dist, folder, log = self.dist, self.folder, self.log
        self.start, best, self.prior_wall, self.prior_train = 0, None, 0.0, 0.0
        state = dist.resume(folder, self.identity, self.step_model, self.optimizer, self.device, log)  # loaded; its step and timers here
        if state is not None:
            self.start, best = state["step"], state["best_val_loss"]
            self.prior_wall, self.prior_train = state["wall_s"], state["train_s"]
        # Rank 0 reads the budget files (and sets a bad one aside); every rank follows its word.
        self.forks.done, restart = dist.share(
            budgets_done(folder, self.forks.side, self.identity, state, log) if dist.is_main else None)
        if restart:  # past the fork of a branch with no result of its own: only a run from step 0 goes through it
            if dist.is_main:
                folder.drop_checkpoint()
            self._build_model()
            state, self.start, best, self.prior_wall, self.prior_train = None, 0, None, 0.0, 0.0
        self.resumed = state is not None
        if self.resumed:
            done = self.forks.done
            note = f" (budgets done: {', '.join(str(b) for b in sorted(done))})" if done else ""
            log(f"resuming {self.identity} from step {self.start}/{self.total}{note}")
        return best

    # ---- the budgets' side trips (trainer/schedule.py) ----

    def take_side_trips(self, step: int) -> None:
        """The budget branches that fork at step: each from the same stable state, put back after."""
        todo = self.forks.due(step)
        if not todo:
            return
        self.checkpoint(step)  # the stable state: a kill during a branch resumes from its fork
        stable = hold(self.model, self.optimizer)
        for branch in todo:
            self._side_trip(branch)
            put_back(self.model, self.optimizer, stable)

    def _side_trip(self, branch: Branch) -> None:
        """Train branch's cooldown from the stable state at its fork, evaluate it as the final
        evaluation of a trial does, and write budgets/<tokens>.json."""
        t = self.trial.train
        b0, meter = time.perf_counter(), self.loss_meter(branch.fork)
        for step in range(branch.fork, branch.steps):
            lr = self.forks.lr(step, branch)
            self.train_step(step, lr, meter.pending)
            if (step + 1) % self.sync_every == 0 or step + 1 == branch.steps:
                meter.read(step + 1)
        metrics = self.observer.evaluate_branch({"train/loss": meter.loss_sum / (branch.cooldown * t.grad_accum),
                                                 "train/lr": lr, "tokens": branch.steps * t.tokens_per_step},
                                                self.model, self.fwd)
        val, best = metrics.get("val/loss"), self.observer.best
        wall = time.perf_counter() - b0
        # best_val_loss: over the stable evaluations up to the fork and the branch's end.
        result = self.result(branch.steps, metrics, best=min(v for v in (best, val) if v is not None) if val is not None else best,
                             wall_s=wall, tokens_per_s=branch.cooldown * t.tokens_per_step / max(wall, 1e-9),
                             budget_tokens=branch.tokens)
        if self.dist.is_main:
            self.folder.write_budget_result(branch.tokens, asdict(result))
        self.forks.done.add(branch.tokens)
        self.log(f"budget {branch.tokens:,} tokens: val loss {val} (cooldown steps {branch.fork}-{branch.steps}, {wall:.1f} s)")

    # ---- a step ----

    def lr_for(self, step: int) -> float:
        """The main run's lr: the largest budget's branch with budgets, else the trial's schedule."""
        return self.forks.main_lr(step) if self.forks.main else lr_at(step, self.total, self.trial.optim)

    def loss_meter(self, start: int) -> LossMeter:
        return LossMeter(self.device, self.dist, start)

    def train_step(self, step: int, lr: float, pending: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step at lr; adds its micro-batches' losses to pending. Returns the
        gradient norm before clipping (None without clipping)."""
        t, optim, task = self.trial.train, self.trial.optim, self.task
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        for micro in range(t.grad_accum):
            x, y = self.dist.local(*task.train_batch(step * t.grad_accum + micro))
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.autocast():
                logits, aux = self.fwd(x, return_aux=True)
                loss = task.loss(logits, y) + self.trial.model.ffn.aux_loss_coef * aux
            (loss / t.grad_accum).backward()
            pending += loss.detach().float()
            if self.sync_every == 1:  # the CPU: catch a NaN before the optimizer step uses it
                _check_finite(self.dist.mean(pending), step + 1, step + 1)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), optim.grad_clip) if optim.grad_clip else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def train_stats(self, step: int, lr: float, grad_norm: torch.Tensor, meter: LossMeter) -> dict[str, float]:
        """The training part of step's row, over the steps since the last row (which it resets)."""
        t = self.trial.train
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        interval = self.timer.elapsed - self.interval_start
        steps_in_interval = meter.micro_batches / t.grad_accum
        tok_s = steps_in_interval * t.batch_size * t.seq_len * t.grad_accum / max(interval, 1e-9)
        stats = {"train/loss": meter.loss_sum / meter.micro_batches, "train/lr": lr, "train/grad_norm": grad_norm,
                 "tokens": step * t.tokens_per_step, "perf/tokens_per_s": tok_s}
        if self.peak:
            stats["perf/mfu"] = tok_s * self.flops_tok / self.peak
        meter.loss_sum, meter.micro_batches, self.interval_start = 0.0, 0, self.timer.elapsed
        return stats

    # ---- checkpoints and the folder ----

    def checkpoint_due(self, step: int) -> bool:
        t = self.trial.train
        return bool(t.ckpt_every and step % t.ckpt_every == 0 and step < self.total)

    def check_folder(self) -> None:
        """Raises FolderRemoved if the folder is no longer this trial's: every rank, or none."""
        gone = self.dist.share(folder_gone(self.folder, self.identity) if self.dist.is_main else None)
        if gone:
            raise FolderRemoved(gone)

    def checkpoint(self, step: int) -> None:
        self.check_folder()
        self.dist.save(self.folder, self.step_model, self.optimizer, {
            "identity": self.identity, "step": step, "best_val_loss": self.observer.best,
            "wall_s": self.prior_wall + time.perf_counter() - self.t0, "train_s": self.prior_train + self.timer.elapsed,
            "budgets_done": sorted(self.forks.done),
        })

    # ---- the end ----

    def save_final(self) -> bool:
        """The main run's (largest budget's) per-token losses, and its final weights, kept for
        later analysis without the optimizer state, which is twice their size and only ever
        needed to resume (the weights only with train.keep_weights). Returns whether per-token
        losses were written."""
        self.check_folder()
        dist, folder = self.dist, self.folder
        whole = dist.full_model(self.model)
        per_token = self.task.per_token_losses(whole.eval(), self.device, self.autocast) if dist.is_main else {}
        if per_token:
            np.savez_compressed(folder.per_token_losses, **per_token)
        if dist.is_main and self.trial.train.keep_weights:
            save_checkpoint(folder.model_weights, {"identity": self.identity, "step": self.total, "model": whole.state_dict()})
        return bool(per_token)

    def result(self, steps: int, metrics: dict[str, float], best: float | None, wall_s: float, tokens_per_s: float,
               budget_tokens: int | None, artifacts: dict[str, str] | None = None) -> TrialResult:
        """A TrialResult for the model as it is after `steps` steps, its last row `metrics`."""
        return TrialResult(
            identity=self.identity, steps=steps, tokens=steps * self.trial.train.tokens_per_step,
            n_params=self.model.num_params(), final_val_loss=metrics.get("val/loss"), best_val_loss=best,
            unigram_entropy=self.task.unigram_entropy, corpus_tokens=self.task.corpus_tokens, wall_s=wall_s,
            tokens_per_s=tokens_per_s, mfu=(tokens_per_s * self.flops_tok / self.peak) if self.peak else None,
            dtype=self.precision.dtype, final_metrics=metrics, artifacts=artifacts or {}, budget_tokens=budget_tokens,
            made_by=self.made_by and {**self.made_by, "dtype": self.precision.reason, "compile": self.compiler.reason},
        )

    def finish(self, per_token: bool) -> TrialResult:
        """The trial's result; rank 0 writes it (result.json last: its presence means finished)."""
        t, start, total = self.trial.train, self.start, self.total
        tok_s = (total - start) * t.tokens_per_step / max(self.timer.elapsed, 1e-9) if total > start else float("nan")
        main = self.forks.main
        result = self.result(
            total, self.observer.last, best=self.observer.best, wall_s=self.prior_wall + time.perf_counter() - self.t0,
            tokens_per_s=tok_s, budget_tokens=main.tokens if main else None,
            artifacts=self.folder.artifacts(per_token_losses=per_token, weights=self.trial.train.keep_weights)
            if self.dist.is_main else {},
        )
        if not self.dist.is_main:
            return result
        result.files = trial_files.listing(self.folder.path, own_budget=main.tokens if main else None)
        if main:  # result.json's twin, listing the same files
            self.folder.write_budget_result(main.tokens, asdict(result))
        self.folder.write_result(asdict(result))
        self.folder.drop_checkpoint()  # after result.json: a kill in between still resumes
        return result


def _sync_every(device: torch.device) -> int:
    return 1 if device.type == "cpu" else ACCEL_SYNC_EVERY


def _check_finite(pending: torch.Tensor, first: int, last: int) -> float:
    """The summed losses of steps first..last, read to the host; raises if any was NaN or inf."""
    value = float(pending)
    if not math.isfinite(value):
        where = f"step {last}" if first == last else f"a step in {first}-{last} (read every {last - first + 1})"
        raise TrialDiverged(f"diverged at {where}: loss={value}")
    return value
