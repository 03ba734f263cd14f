"""Several token budgets from one run (train.budgets; the schedule is trainer/schedule.py's).

The run is the largest budget's, and at each smaller budget's fork step it takes a side trip:
it checkpoints the stable state, trains that budget's cooldown, evaluates as a trial's final
evaluation does, writes budgets/<tokens>.json, and puts the stable state back. metrics.jsonl,
probes/ and the per-token losses follow the main run only.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from .schedule import Branch, branch_lr_at, budget_branches, budget_warmup

if TYPE_CHECKING:
    from .loop import Trainer


class BudgetForks:
    """The budgets of a trainer's trial: `main` is the largest (None without budgets), `side`
    the others in fork order, `done` those whose branch has its file."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        t, optim = trainer.trial.train, trainer.trial.optim
        branches = budget_branches(t.budgets, t.tokens_per_step, t.cooldown_frac) if t.budgets else []
        self.warmup = budget_warmup(branches, optim) if branches else 0
        self.main: Branch | None = max(branches, key=lambda b: b.steps) if branches else None
        self.side = [b for b in branches if b is not self.main]
        self.done: set[int] = set()

    def main_lr(self, step: int) -> float:
        return branch_lr_at(step, self.main, self.warmup, self.trainer.trial.optim)

    def fork(self, step: int) -> None:
        """The side trips that fork at step: each from the same stable state, put back after."""
        todo = [b for b in self.side if b.fork == step and b.tokens not in self.done]
        if not todo:
            return
        tr = self.trainer
        tr.checkpoint(step)  # the stable state: a kill during a branch resumes from its fork
        stable = copy.deepcopy({"model": tr.model.state_dict(), "optimizer": tr.optimizer.state_dict()})
        rng = torch.get_rng_state()  # nothing in a step draws from it today; kept so nothing can drift
        for branch in todo:
            self.run_branch(branch)
            tr.model.load_state_dict(stable["model"])
            # A copy each time: the optimizer keeps the tensors it is given and updates them in place.
            tr.optimizer.load_state_dict(copy.deepcopy(stable["optimizer"]))
            torch.set_rng_state(rng)

    def run_branch(self, branch: Branch) -> None:
        """Train branch's cooldown from the stable state at its fork, evaluate it as the final
        evaluation of a trial does, and write budgets/<tokens>.json."""
        tr, t = self.trainer, self.trainer.trial.train
        b0, meter = time.perf_counter(), tr.loss_meter(branch.fork)
        for step in range(branch.fork, branch.steps):
            lr = branch_lr_at(step, branch, self.warmup, tr.trial.optim)
            tr.train_step(step, lr, meter.pending)
            if (step + 1) % tr.sync_every == 0 or step + 1 == branch.steps:
                meter.read(step + 1)
        metrics = tr.observer.evaluate_branch({"train/loss": meter.loss_sum / (branch.cooldown * t.grad_accum),
                                               "train/lr": lr, "tokens": branch.steps * t.tokens_per_step})
        val, best = metrics.get("val/loss"), tr.observer.best
        wall = time.perf_counter() - b0
        # best_val_loss: over the stable evaluations up to the fork and the branch's end.
        result = tr.result(branch.steps, metrics, best=min(v for v in (best, val) if v is not None) if val is not None else best,
                           wall_s=wall, tokens_per_s=branch.cooldown * t.tokens_per_step / max(wall, 1e-9),
                           budget_tokens=branch.tokens)
        if tr.dist.is_main:
            tr.folder.write_budget_result(branch.tokens, asdict(result))
        self.done.add(branch.tokens)
        tr.log(f"budget {branch.tokens:,} tokens: val loss {val} (cooldown steps {branch.fork}-{branch.steps}, {wall:.1f} s)")
