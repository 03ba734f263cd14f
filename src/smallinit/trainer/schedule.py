"""The learning-rate schedule, and the cooldown branches of a run with several token budgets.

One budget: linear warmup, then cosine, WSD (constant, then a linear decay over the last
optim.decay_frac of the steps) or constant, ending at lr * min_lr_ratio (`lr_at`).

Several budgets (train.budgets): warmup-stable-decay with one cooldown branch per budget, as
Hägele et al. (2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
Durations") do to get several budgets out of one run. The warmup is fixed in steps
(optim.warmup_frac of the largest budget), so every budget shares it; the stable phase is one
trajectory at the peak lr; budget b forks from it after (1 - train.cooldown_frac) of b's
steps and decays linearly over the rest, to the same floor as WSD. The largest budget's branch
is the main run itself. Branches are taken in order of their fork step: a later budget may fork
before an earlier one ends, which is fine, since every branch starts from the stable trajectory
and the trajectory does not depend on any branch.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def lr_at(step: int, total: int, optim) -> float:
    """Linear warmup, then cosine or WSD (stable, then linear decay) to lr * min_lr_ratio."""
    warmup = int(optim.warmup_frac * total)
    if step < warmup:
        return optim.lr * (step + 1) / warmup
    floor = optim.lr * optim.min_lr_ratio
    if optim.schedule == "constant":
        return optim.lr
    if optim.schedule == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        return floor + (optim.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    decay_start = total - int(optim.decay_frac * total)
    if step < decay_start:
        return optim.lr
    return optim.lr - (optim.lr - floor) * (step - decay_start) / max(1, total - decay_start)


@dataclass(frozen=True)
class Branch:
    """One budget's cooldown: steps fork..steps-1 decay the lr, starting from the stable state
    after `fork` steps."""

    tokens: int  # the budget, a whole number of steps' tokens
    steps: int  # steps that reach it
    fork: int  # stable steps trained before its cooldown starts

    @property
    def cooldown(self) -> int:
        return self.steps - self.fork


def budget_branches(budgets: tuple[int, ...], tokens_per_step: int, cooldown_frac: float) -> list[Branch]:
    """The branches of train.budgets, in the order the run takes them (by fork step). The
    cooldown is int(cooldown_frac * steps), as WSD's decay is int(decay_frac * total)."""
    out = []
    for tokens in budgets:
        steps = tokens // tokens_per_step
        out.append(Branch(tokens=tokens, steps=steps, fork=steps - int(cooldown_frac * steps)))
    return sorted(out, key=lambda b: (b.fork, b.steps))


def budget_warmup(branches: list[Branch], optim) -> int:
    """Warmup steps, the same for every branch: optim.warmup_frac of the largest budget."""
    return int(optim.warmup_frac * max(b.steps for b in branches))


def branch_lr_at(step: int, branch: Branch, warmup: int, optim) -> float:
    """The lr of `branch` at `step`: warmup, the peak until the fork, then linear to the floor."""
    if step < warmup:
        return optim.lr * (step + 1) / warmup
    if step < branch.fork:
        return optim.lr
    floor = optim.lr * optim.min_lr_ratio
    return optim.lr - (optim.lr - floor) * (step - branch.fork) / branch.cooldown


# ---- a run's budgets: the plan, and the stable state held across a side trip ----
# The run is the largest budget's, and at each smaller budget's fork step it takes a side trip:
# it checkpoints the stable state, trains that budget's cooldown, evaluates as a trial's final
# evaluation does, writes budgets/<tokens>.json, and puts the stable state back. The trainer
# (trainer/loop.py, `Trainer.take_side_trips`) trains each trip with its own steps; metrics.jsonl,
# probes/ and the per-token losses follow the main run only.

class BudgetForks:
    """The budgets of a trial: `main` is the largest it trains (None without budgets; below the
    plan's largest with train.stop_after), `side` the others it trains in fork order, `done`
    those whose branch has its file. The warmup is the whole plan's, trained or not."""

    def __init__(self, train, optim):  # a TrainConfig and an OptimConfig (config.py imports this module)
        self.optim = optim
        plan = budget_branches(train.budgets, train.tokens_per_step, train.cooldown_frac) if train.budgets else []
        self.warmup = budget_warmup(plan, optim) if plan else 0
        branches = [b for b in plan if b.tokens in train.budgets_trained]
        self.main: Branch | None = max(branches, key=lambda b: b.steps) if branches else None
        self.side = [b for b in branches if b is not self.main]
        self.done: set[int] = set()

    def main_lr(self, step: int) -> float:
        return branch_lr_at(step, self.main, self.warmup, self.optim)

    def lr(self, step: int, branch: Branch) -> float:
        return branch_lr_at(step, branch, self.warmup, self.optim)

    def due(self, step: int) -> list[Branch]:
        """The side trips that fork at step and have no result yet."""
        return [b for b in self.side if b.fork == step and b.tokens not in self.done]


def hold(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The stable state a side trip starts from and is undone to: weights, optimizer, RNG."""
    import torch  # here, not at the top: config.py imports this module, and a sweep's driver need not load torch

    # The RNG: nothing in a step draws from it today; kept so nothing can drift.
    return {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
            "rng": torch.get_rng_state()}


def put_back(model: torch.nn.Module, optimizer: torch.optim.Optimizer, stable: dict) -> None:
    import torch

    model.load_state_dict(stable["model"])
    # A copy each time: the optimizer keeps the tensors it is given and updates them in place.
    optimizer.load_state_dict(copy.deepcopy(stable["optimizer"]))
    torch.set_rng_state(stable["rng"])
