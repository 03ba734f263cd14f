"""What a trial measures besides its training loss: the validation evaluation (and the best
loss so far), the probes and their cosine heatmaps, each on its own cadence, and the one row
per logged step that every reporter (metrics.jsonl, Ray Tune, W&B) receives."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from smallinit.model import run_probes

if TYPE_CHECKING:
    import torch

    from .loop import Trainer


def _is_heatmap_step(step: int, total: int, every: int) -> bool:
    """Keep cosine matrices at step 0, log-spaced probe steps and the end."""
    if step in (0, total):
        return True
    k = step // every
    return step % every == 0 and (k & (k - 1)) == 0


class Observer:
    """Evaluates and probes the trainer's model; `best` is the lowest validation loss seen (a
    resumed run starts from its checkpoint's), `last` the latest logged row."""

    def __init__(self, trainer: Trainer, best: float | None):
        self.trainer = trainer
        self.best = best
        self.last: dict[str, float] = {}

    def row_due(self, step: int) -> bool:
        """Whether step logs a row: an evaluation, a probe, the end, or train.log_every."""
        t = self.trainer.trial.train
        return bool(step % t.eval_every == 0 or step == self.trainer.total
                    or (t.probe_every and step % t.probe_every == 0) or (t.log_every and step % t.log_every == 0))

    def observe(self, step: int, train_stats: dict[str, float]) -> dict[str, float]:
        """Adds whatever is due at step to train_stats (evaluation, probes, a heatmap file) and
        reports the row, unless it holds nothing worth a row."""
        tr, t = self.trainer, self.trainer.trial.train
        dist = tr.dist
        metrics = dict(train_stats)
        evaluate = step % t.eval_every == 0 or step == tr.total
        probe = t.probe_every and (step % t.probe_every == 0 or step == tr.total)
        whole = dist.full_model(tr.model) if evaluate or probe else None  # every rank calls it (FSDP gathers)
        if evaluate:
            if dist.is_main:
                metrics.update(self._evaluate(whole))
            metrics = dist.share(metrics)  # every rank reports each evaluation (Ray Train's report is collective)
            if "val/loss" in metrics:
                self.best = metrics["val/loss"] if self.best is None else min(self.best, metrics["val/loss"])
                metrics["val/best_loss"] = self.best
        if probe and dist.is_main:
            probes = run_probes(whole, tr.probe_idx)
            metrics.update(probes.scalars)
            if _is_heatmap_step(step, tr.total, t.probe_every):
                np.savez_compressed(tr.folder.probe_snapshot(step),
                                    **{k: v.numpy().astype(np.float16) for k, v in probes.cosine_matrices.items()})
        if len(metrics) > len(train_stats) or "train/loss" in metrics:
            tr.report.log(step, metrics)
        self.last = metrics
        return metrics

    def evaluate_branch(self, metrics: dict[str, float]) -> dict[str, float]:
        """A budget branch's end, measured as a trial's final evaluation is (the probes'
        scalars, no heatmap); reported to no one, since the rows follow the main run."""
        tr = self.trainer
        metrics = dict(metrics)
        whole = tr.dist.full_model(tr.model)  # every rank calls it (FSDP gathers); rank 0 evaluates
        if tr.dist.is_main:
            metrics.update(self._evaluate(whole))
            if tr.trial.train.probe_every:
                metrics.update(run_probes(whole, tr.probe_idx).scalars)
        return tr.dist.share(metrics)

    def _evaluate(self, whole: torch.nn.Module) -> dict[str, float]:
        """The validation metrics, in eval mode. One process evaluates through the compiled
        forward (the same kernels as training); several evaluate the gathered model on rank 0."""
        tr = self.trainer
        whole.eval()
        metrics = tr.task.evaluate(tr.fwd if tr.dist.world == 1 else whole, tr.device, tr.autocast)
        whole.train()
        return metrics
