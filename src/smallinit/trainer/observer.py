"""What a trial measures besides its training loss: the validation evaluation (and the best
loss so far), the probes and their cosine heatmaps, each on its own cadence, and the one row
per logged step that every reporter (metrics.jsonl, Ray Tune, W&B) receives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from smallinit.core.trial_dir import TrialDir
from smallinit.model import run_probes

from .config import TrainConfig
from .reporting import Reporter


@dataclass(frozen=True)
class Measures:
    """What the observer measures with, fixed for a trial: its cadences and length, the processes,
    where heatmaps and rows go, and the task's evaluation on this device. The model and its
    forward (compiled or not, which changes once the trainer compiles) come with each call."""

    cadence: TrainConfig  # eval_every, probe_every, log_every
    total: int
    dist: Any  # trainer/distributed.py: Single or Parallel
    folder: TrialDir
    report: Reporter
    task: Any  # trainer/tasks.py: evaluate(forward, device, autocast)
    device: torch.device
    autocast: Callable[[], Any]
    probe_idx: torch.Tensor


def _is_heatmap_step(step: int, total: int, every: int) -> bool:
    """Keep cosine matrices at step 0, log-spaced probe steps and the end."""
    if step in (0, total):
        return True
    k = step // every
    return step % every == 0 and (k & (k - 1)) == 0


class Observer:
    """Evaluates and probes the model it is handed; `best` is the lowest validation loss seen (a
    resumed run starts from its checkpoint's), `last` the latest logged row."""

    def __init__(self, measures: Measures, best: float | None):
        self.m = measures
        self.best = best
        self.last: dict[str, float] = {}

    def row_due(self, step: int) -> bool:
        """Whether step logs a row: an evaluation, a probe, the end, or train.log_every."""
        t = self.m.cadence
        return bool(step % t.eval_every == 0 or step == self.m.total
                    or (t.probe_every and step % t.probe_every == 0) or (t.log_every and step % t.log_every == 0))

    def observe(self, step: int, train_stats: dict[str, float], model: torch.nn.Module,
                forward: Callable) -> dict[str, float]:
        """Adds whatever is due at step to train_stats (evaluation, probes, a heatmap file) and
        reports the row, unless it holds nothing worth a row. `forward`: the trainer's current one."""
        m, t = self.m, self.m.cadence
        dist = m.dist
        metrics = dict(train_stats)
        evaluate = step % t.eval_every == 0 or step == m.total
        probe = t.probe_every and (step % t.probe_every == 0 or step == m.total)
        whole = dist.full_model(model) if evaluate or probe else None  # every rank calls it (FSDP gathers)
        if evaluate:
            if dist.is_main:
                metrics.update(self._evaluate(whole, forward))
            metrics = dist.share(metrics)  # every rank reports each evaluation (Ray Train's report is collective)
            if "val/loss" in metrics:
                self.best = metrics["val/loss"] if self.best is None else min(self.best, metrics["val/loss"])
                metrics["val/best_loss"] = self.best
        if probe and dist.is_main:
            probes = run_probes(whole, m.probe_idx)
            metrics.update(probes.scalars)
            if _is_heatmap_step(step, m.total, t.probe_every):
                np.savez_compressed(m.folder.probe_snapshot(step),
                                    **{k: v.numpy().astype(np.float16) for k, v in probes.cosine_matrices.items()})
        if len(metrics) > len(train_stats) or "train/loss" in metrics:
            m.report.log(step, metrics)
        self.last = metrics
        return metrics

    def evaluate_branch(self, metrics: dict[str, float], model: torch.nn.Module, forward: Callable) -> dict[str, float]:
        """A budget branch's end, measured as a trial's final evaluation is (the probes'
        scalars, no heatmap); reported to no one, since the rows follow the main run."""
        m = self.m
        metrics = dict(metrics)
        whole = m.dist.full_model(model)  # every rank calls it (FSDP gathers); rank 0 evaluates
        if m.dist.is_main:
            metrics.update(self._evaluate(whole, forward))
            if m.cadence.probe_every:
                metrics.update(run_probes(whole, m.probe_idx).scalars)
        return m.dist.share(metrics)

    def _evaluate(self, whole: torch.nn.Module, forward: Callable) -> dict[str, float]:
        """The validation metrics, in eval mode. One process evaluates through the trainer's
        forward (the same kernels as training); several evaluate the gathered model on rank 0."""
        m = self.m
        whole.eval()
        metrics = m.task.evaluate(forward if m.dist.world == 1 else whole, m.device, m.autocast)
        whole.train()
        return metrics
