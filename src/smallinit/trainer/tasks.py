"""What a trial learns: language modelling on a corpus, or the anchor-function probe.

A task hands the loop batches by step index (so a resumed run sees exactly the batches an
uninterrupted one would), computes the loss from logits, and evaluates a model. The loop
knows nothing else about data.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from smallinit.data import anchor_task

from .config import TrialConfig


class LMTask:
    """Next-token prediction on a prepared corpus, scored on a fixed validation slice."""

    def __init__(self, trial: TrialConfig, log=print, prepared=None):
        from smallinit.data.pipeline import TrainBatches, prepare, val_batches

        self.prepared = prepared if prepared is not None else prepare(trial.data, log=log)
        t = trial.train
        self.batches = TrainBatches(self.prepared.train_tokens(), t.batch_size, t.seq_len, t.seed)
        self.val = val_batches(self.prepared.val_tokens(), t.batch_size, t.seq_len, t.eval_tokens)
        per_token = val_batches(self.prepared.val_tokens(), t.batch_size, t.seq_len, t.per_token_eval_tokens)
        self.per_token_batches = per_token
        source = self.val or per_token or [self.batches.batch(0)]
        self.probe_idx = source[0][0][: t.probe_batch]
        self.unigram_entropy = self.prepared.unigram_entropy
        self.corpus_tokens = self.prepared.n_train_tokens

    def train_batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches.batch(i)

    @staticmethod
    def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    @torch.no_grad()
    def evaluate(self, model, device, autocast) -> dict[str, float]:
        if not self.val:
            return {}
        total, count = 0.0, 0
        for x, y in self.val:
            with autocast():
                logits = model(x.to(device))
            total += float(F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="sum"))
            count += y.numel()
        return {"val/loss": total / count, "val/unigram_entropy": self.unigram_entropy}

    @torch.no_grad()
    def per_token_losses(self, model, device, autocast) -> dict[str, np.ndarray]:
        """Loss of every token of the fixed eval slice: the same tokens in every trial, so
        two trials can be compared token by token (Delta_sym in the report)."""
        tokens, losses = [], []
        for x, y in self.per_token_batches:
            with autocast():
                logits = model(x.to(device))
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="none")
            tokens.append(y.flatten().numpy())
            losses.append(loss.cpu().numpy())
        if not tokens:
            return {}
        return {"targets": np.concatenate(tokens).astype(np.int32), "loss": np.concatenate(losses).astype(np.float32)}


class AnchorTask:
    """The anchor-function composition task: loss and accuracy on the last position only."""

    def __init__(self, trial: TrialConfig, log=print):
        self.splits = anchor_task.make_dataset(trial.data)
        self.batch_size, self.seed = trial.train.batch_size, trial.train.seed
        x = self.splits["train"][0]
        self.probe_idx = x[: trial.train.probe_batch]
        # A uniform guess over the vocabulary: the loss a model that learned nothing gets.
        self.unigram_entropy = math.log(trial.data.vocab_size)
        self.corpus_tokens = None  # a task drawn from a fixed set: passes are not the question
        log(f"anchor task: {len(x)} train sequences, " + ", ".join(f"{k} {len(v[0])}" for k, v in self.splits.items()))

    def train_batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.splits["train"]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        idx = torch.randint(len(x), (self.batch_size,), generator=g)
        return x[idx], y[idx]

    @staticmethod
    def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits[:, -1].float(), y)

    @torch.no_grad()
    def evaluate(self, model, device, autocast) -> dict[str, float]:
        def predict(x: torch.Tensor) -> torch.Tensor:
            with autocast():
                return model(x.to(device))[:, -1].argmax(-1).cpu()

        out = anchor_task.evaluate(predict, self.splits)
        x, y = self.splits["test_in_dist"]
        with autocast():
            logits = model(x.to(device))
        out["val/loss"] = float(F.cross_entropy(logits[:, -1].float(), y.to(device)))
        return out

    def per_token_losses(self, model, device, autocast) -> dict[str, np.ndarray]:
        return {}


def make_task(trial: TrialConfig, log=print, prepared=None) -> LMTask | AnchorTask:
    """The trial's task; `prepared` is its corpus if already prepared (the anchor task has none)."""
    if isinstance(trial.data, anchor_task.AnchorData):
        return AnchorTask(trial, log)
    return LMTask(trial, log, prepared)

