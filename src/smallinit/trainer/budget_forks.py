"""Several token budgets from one run (train.budgets; the schedule is trainer/schedule.py's).

The run is the largest budget's, and at each smaller budget's fork step it takes a side trip:
it checkpoints the stable state, trains that budget's cooldown, evaluates as a trial's final
evaluation does, writes budgets/<tokens>.json, and puts the stable state back. This module holds
the plan (which branch forks where, at what lr) and the stable state held across a side trip;
the trainer (trainer/loop.py, `Trainer.take_side_trips`) trains each trip with its own steps.
metrics.jsonl, probes/ and the per-token losses follow the main run only.
"""

from __future__ import annotations

import copy

import torch

from .config import OptimConfig, TrainConfig
from .schedule import Branch, branch_lr_at, budget_branches, budget_warmup


class BudgetForks:
    """The budgets of a trial: `main` is the largest (None without budgets), `side` the others
    in fork order, `done` those whose branch has its file."""

    def __init__(self, train: TrainConfig, optim: OptimConfig):
        self.optim = optim
        branches = budget_branches(train.budgets, train.tokens_per_step, train.cooldown_frac) if train.budgets else []
        self.warmup = budget_warmup(branches, optim) if branches else 0
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
    # The RNG: nothing in a step draws from it today; kept so nothing can drift.
    return {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
            "rng": torch.get_rng_state()}


def put_back(model: torch.nn.Module, optimizer: torch.optim.Optimizer, stable: dict) -> None:
    model.load_state_dict(stable["model"])
    # A copy each time: the optimizer keeps the tensors it is given and updates them in place.
    optimizer.load_state_dict(copy.deepcopy(stable["optimizer"]))
    torch.set_rng_state(stable["rng"])
