"""Whether a trial trains through `torch.compile`: `train.compile=auto` compiles where the run is
long enough to repay the compilation.

Compiling costs seconds before the first step (tens of seconds with an empty inductor cache, a
few with the graph already cached) and then saves a fraction of every step. A 60-step trial
never earns that back; a 4,096-step one earns it back many times. So `auto` trains the first
PROBE_STEPS steps eager, times them, and compiles for the rest when

    steps left x eager step time x (1 - 1 / speedup)  >  compile cost

with the speedup and compile cost this machine measured the last time it compiled a model of the
same shape (a small JSON ledger under the cache folder), or conservative priors before it ever
has. A compiled run writes back what it measured, so the next trial of that shape decides on
this machine's figures. Compilation is not part of a trial's identity: it changes the rounding
of the kernels, not the training (docs/training.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from smallinit.core.plain import plain
from smallinit.core.provenance import cpu_identity

PROBE_STEPS = 16  # eager steps timed before `auto` decides (the first ones warm the allocator)
# Priors where this machine has never compiled the shape: an empty inductor cache at d = 128,
# 4 layers took ~40 s on a 2-core Xeon and the compiled bf16 step ran 1.3-1.7x the eager one;
# the priors are set to need more than that before compiling.
PRIOR_COMPILE_S = 60.0
PRIOR_SPEEDUP = 1.3


@dataclass(frozen=True)
class CompileChoice:
    compile: bool
    reason: str


def _ledger_path(shape_key: str) -> Path:
    root = Path(os.environ.get("SMALLINIT_CACHE", "~/.cache/smallinit")).expanduser()
    model, flags = cpu_identity()
    key = hashlib.sha256(f"{model}|{sorted(flags)}|{torch.__version__}|{shape_key}".encode()).hexdigest()[:16]
    return root / "compile" / f"{key}.json"


def shape_key(trial) -> str:
    """What the compiled graph depends on: the model's shape, the batch, the dtype."""
    t = trial.train
    model = {k: v for k, v in plain(trial.model).items() if k != "init"}  # gamma changes the weights, not the graph
    return json.dumps({"model": model,
                       "batch": [t.batch_size, t.seq_len], "dtype": t.dtype}, sort_keys=True, default=str)


def measured(key: str) -> dict | None:
    try:
        got = json.loads(_ledger_path(key).read_text())
        return got if got["compile_s"] >= 0 and got["speedup"] > 0 else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def record(key: str, compile_s: float, speedup: float) -> None:
    """What this machine measured compiling this shape; a read-only cache only costs a prior."""
    path = _ledger_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"compile_s": round(compile_s, 2), "speedup": round(speedup, 4)}))
        os.replace(tmp, path)
    except OSError:
        pass


def decide(steps_left: int, eager_step_s: float, key: str) -> CompileChoice:
    """compile=auto after the eager probe: compile iff the steps left repay the compile cost."""
    known = measured(key)
    cost, speedup = (known["compile_s"], known["speedup"]) if known else (PRIOR_COMPILE_S, PRIOR_SPEEDUP)
    source = "measured on this machine for this shape" if known else "priors: this shape never compiled here"
    saving = steps_left * eager_step_s * (1 - 1 / speedup)
    why = (f"{steps_left:,} steps left x {eager_step_s * 1e3:.0f} ms eager x (1 - 1/{speedup:.2f}) = {saving:.0f} s "
           f"saved {'>' if saving > cost else '<='} {cost:.0f} s to compile ({source})")
    return CompileChoice(saving > cost, f"train.compile=auto: {'compiled' if saving > cost else 'eager'}: {why}")


class RunCompiler:
    """train.compile for one run: true and false act at the start; auto times the first
    PROBE_STEPS steps eager, decides (rank 0's decision for every rank), and after compiling
    times the first compiled step (its excess over an eager step is the compile cost) and the
    next MEASURE_STEPS (their median against the eager median is the speedup) into the ledger.
    `reason` is the line the trial's record keeps."""

    MEASURE_STEPS = 16

    def __init__(self, mode: str, key: str, dist, log):
        self.mode, self.key, self.dist, self.log = mode, key, dist, log
        self.eager_s: list[float] = []
        self.compiled_s: list[float] = []
        self.compiled = mode == "true"
        self.reason = {"true": "train.compile=true", "false": "train.compile=false"}.get(mode)

    def forward(self, model):
        """The forward a run starts with."""
        return compile_model(model) if self.compiled else model

    def after_step(self, step_s: float, steps_left: int, model):
        """Called after each main-run step with its seconds; returns the compiled forward at the
        step `auto` decides to compile, else None."""
        if self.mode != "auto":
            return None
        if self.reason is None:  # still probing
            self.eager_s.append(step_s)
            if len(self.eager_s) < PROBE_STEPS and steps_left > 0:
                return None
            choice = self.dist.share(self._decide(steps_left) if self.dist.is_main else None)
            self.reason, self.compiled = choice.reason, choice.compile
            self.log(f"compile: {self.reason}")
            return compile_model(model) if choice.compile else None
        if self.compiled and len(self.compiled_s) <= self.MEASURE_STEPS:
            self.compiled_s.append(step_s)
            if len(self.compiled_s) == self.MEASURE_STEPS + 1 and self.dist.is_main:
                eager = _median(self.eager_s[PROBE_STEPS // 4:])
                # A graph already in the inductor cache can compile in less than a step saves.
                record(self.key, max(0.0, self.compiled_s[0] - eager), eager / _median(self.compiled_s[1:]))
        return None

    def _decide(self, steps_left: int) -> CompileChoice:
        if steps_left == 0:
            return CompileChoice(False, f"train.compile=auto: eager: the run ended within its {len(self.eager_s)}-step probe")
        # The first steps warm the allocator and the kernels' caches: the median of the rest.
        return decide(steps_left, _median(self.eager_s[PROBE_STEPS // 4:]), self.key)


def compile_model(model):
    """Static shapes: a second input shape (a shorter last evaluation batch, a probe's batch) would
    make dynamo recompile with a symbolic batch dimension, whose kernels are generic; static, each
    shape keeps a graph of its own. The trainer, the bench's reference loop and profile_step
    compile through this one function, so the reference is held to the same graph."""
    return torch.compile(model, dynamic=False)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def speed_line(trial) -> str:
    """What a sweep's trials will compute in on this machine and how they choose compilation:
    the driver's first screen says it before any trial starts (each trial's log and result.json
    then say what it chose)."""
    from .precision import resolve_device, resolve_dtype

    t = trial.train
    try:
        dtype = resolve_dtype(resolve_device(t.device), t.dtype)
        line = f"trials on this machine: {dtype.dtype} ({dtype.reason}); train.compile={t.compile}"
    except RuntimeError:  # train.device=cuda from a driver without a GPU: the workers resolve it
        line = f"trials: train.dtype={t.dtype} on their workers' {t.device}; train.compile={t.compile}"
    if t.compile != "auto":
        return line
    known = measured(shape_key(trial))
    figures = (f"this machine compiled this shape in {known['compile_s']:.0f} s for {known['speedup']:.2f}x" if known
               else f"priors {PRIOR_COMPILE_S:.0f} s and {PRIOR_SPEEDUP:.2f}x until this machine has compiled this shape")
    return (f"{line}: each trial times its first {PROBE_STEPS} steps eager and compiles if its steps left "
            f"repay the compile ({figures}; {t.total_steps:,} steps a trial)")
