"""How long trials will take on this machine, for `--show`: the first trial's model timed for a
few training steps and forward passes on this CPU (at most MEASURE_S, after one warm-up step),
then every trial's time worked out from its tokens, scaled by its FLOPs per token against the
timed one's.

measure() imports torch: --show calls it in its child process (show._torch_side), after the
memory lines, so the timing shares the CPUs with nothing --show itself does. It writes nothing:
random token ids stand in for the corpus, and the model and optimizer are dropped after.
"""

from __future__ import annotations

import heapq
import os
import time
from dataclasses import dataclass

from smallinit.trainer.config import TrialConfig, flops_per_token

MEASURE_S = 3.0  # timed steps stop once this much has passed (at least MIN_STEPS of each kind)
MIN_STEPS = 2
# One timed step must take seconds, not minutes: a step of more FLOPs (at the trial's batch, or
# else at one sequence) is not timed here. ~5 s at 40 GFLOP/s, a good core's fp32 rate.
MAX_STEP_FLOPS = 2e11


@dataclass(frozen=True)
class Rate:
    """What was timed: training tokens/s (forward, backward, clipping, AdamW) and evaluation
    tokens/s (forward alone), of a trial whose FLOPs per token are `flops_per_token`."""

    train_tokens_per_s: float
    eval_tokens_per_s: float
    flops_per_token: float
    threads: int
    dtype: str

    def seconds(self, trial: TrialConfig, trained_tokens: int) -> float:
        """One trial's training and evaluation time at this rate, scaled by its FLOPs per token."""
        scale = flops_per_token(trial) / self.flops_per_token
        return scale * (trained_tokens / self.train_tokens_per_s + eval_tokens(trial) / self.eval_tokens_per_s)


def eval_tokens(trial: TrialConfig) -> int:
    """Tokens a trial scores without training: eval_tokens at step 0, every eval_every steps, at
    the end and at each other budget's end, then the per-token losses of the final model."""
    t = trial.train
    total = t.total_steps
    evals = 1 + total // t.eval_every + (1 if total % t.eval_every else 0)
    if t.budgets:
        evals += len(t.budgets_trained) - 1
    return evals * t.eval_tokens + t.per_token_eval_tokens


def not_measured(trial: TrialConfig, workers: int, gpu: bool) -> str | None:
    """Why the trial cannot be timed here (None: it can)."""
    if gpu or trial.train.device == "cuda":
        return "it runs on a GPU; --show times this machine's CPU only"
    if workers > 1:
        return f"it runs on {workers} workers; --show times one process"
    if flops_per_token(trial) * trial.train.seq_len > MAX_STEP_FLOPS:
        return f"one step of {trial.preset or 'this model'} is too large to time on a CPU in seconds"
    return None


def measure(trial: TrialConfig, threads: int | None, budget_s: float = MEASURE_S) -> Rate:
    """Time training steps and forward passes of the trial's model on this CPU, in the dtype
    train.dtype picks here, on `threads` torch threads (None: torch's default). Rows per step:
    the trial's batch, fewer where its step exceeds MAX_STEP_FLOPS."""
    import torch
    import torch.nn.functional as F

    from smallinit.model import Transformer
    from smallinit.trainer.loop import make_optimizer
    from smallinit.trainer.machine.memory import planned_dtype
    from smallinit.trainer.machine.precision import autocast_for

    t = trial.train
    if threads:
        torch.set_num_threads(threads)
    rows = max(1, min(t.batch_size, int(MAX_STEP_FLOPS // (flops_per_token(trial) * t.seq_len))))
    dtype = planned_dtype(trial)
    autocast = autocast_for(torch.device("cpu"), dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, trial.model.vocab_size, (rows, t.seq_len), generator=gen)
    y = torch.randint(0, trial.model.vocab_size, (rows, t.seq_len), generator=gen)
    model = Transformer(trial.model)
    optimizer = make_optimizer(model, trial.optim)
    coef = trial.model.ffn.aux_loss_coef

    def train_step() -> None:
        with autocast():
            logits, aux = model(x, return_aux=True)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) + coef * aux
        loss.backward()
        if trial.optim.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), trial.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def eval_step() -> None:
        with torch.no_grad(), autocast():
            model(x)

    train_step()  # warm-up: first-call allocations, AdamW's state
    train_rate = _timed(train_step, rows * t.seq_len, budget_s * 2 / 3)
    eval_rate = _timed(eval_step, rows * t.seq_len, budget_s / 3)
    return Rate(train_rate, eval_rate, flops_per_token(trial), torch.get_num_threads(), dtype)


def _timed(step, tokens: int, budget_s: float) -> float:
    """Tokens/s of step(), run MIN_STEPS times and then until budget_s has passed."""
    n, start = 0, time.perf_counter()
    while n < MIN_STEPS or time.perf_counter() - start < budget_s:
        step()
        n += 1
    return n * tokens / (time.perf_counter() - start)


def at_a_time(ray_cfg: dict, max_concurrent: int | None, workers: int, n_trials: int) -> int | None:
    """How many trials a local Ray runs at once: its CPUs (ray.num_cpus, else this machine's
    cores) over each trial's (ray.cpus_per_trial x workers), capped by max_concurrent and the
    trial count. None with ray.address: the cluster decides."""
    if ray_cfg.get("address"):
        return None
    cpus = float(ray_cfg.get("num_cpus") or len(os.sched_getaffinity(0)))
    k = max(1, int(cpus // (float(ray_cfg.get("cpus_per_trial") or 1) * max(1, workers))))
    return max(1, min(k, max_concurrent or k, n_trials))


def makespan(seconds: list[float], k: int) -> float:
    """Wall time of trials of these durations run in order, k at a time."""
    slots = [0.0] * max(1, k)
    for s in seconds:
        heapq.heappush(slots, heapq.heappop(slots) + s)
    return max(slots)


def duration(seconds: float) -> str:
    """`0.8 min`, `24 min`, `1.6 h`, `41 h`."""
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 36000 else f"{seconds / 3600:.0f} h"


def line(rate: Rate, seconds: list[float], k: int | None, what: str | None) -> str:
    """`# estimated time: ~N min per trial on this machine (measured X tokens/s), ~M min for
    the grid at K at a time`; `what` None: one trial run here (no -m)."""
    low, high = duration(min(seconds)), duration(max(seconds))
    each = f"~{low}" if low == high else f"~{low} to {high}"
    threads = f"{rate.threads} thread" + ("s" if rate.threads != 1 else "")
    measured = f"measured {rate.train_tokens_per_s:,.0f} tokens/s, {rate.dtype}, {threads}"
    if what is None:
        return f"# estimated time: {each} on this machine ({measured})"
    out = f"# estimated time: {each} per trial on this machine ({measured})"
    if k is None:
        return f"{out}, ~{duration(sum(seconds))} for {what} one at a time (ray.address: the cluster sets how many at once)"
    return f"{out}, ~{duration(makespan(seconds, k))} for {what} at {k} at a time"
