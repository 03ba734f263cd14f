"""Typed trial configuration: what a user sets (`TrialArgs`) and the trial it builds (`TrialConfig`).

`TrialArgs` mirrors conf/: a model preset and its overrides, init, norm, attn, data, optim and
train. Its dataclasses are the schema Hydra composes against (sweeper/config/config.py registers them),
so their defaults are the command line's: `TrialArgs().build()` is the trial `python sweep.py`
trains. `build()` is the one place settings are derived from each other (the preset's shape,
the data's vocabulary, budgets per parameter).

A `TrialConfig` is plain frozen dataclasses: it pickles across Ray processes with no Hydra
state, and its `identity()` (a hash of everything that changes the numbers, minus hardware
and paths) names the trial, so a rerun of the same sweep finds finished work.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smallinit.core.errors import require
from smallinit.core.flops import training_flops_per_token
from smallinit.core.plain import plain
from smallinit.data.config import BilingualData, DataConfig, data_config_from_dict
from smallinit.model.config import (
    AttnConfig,
    FFNConfig,
    InitConfig,
    ModelConfig,
    ModelPreset,
    NormConfig,
)

from .schedule import budget_branches, budget_warmup

SCHEDULES = ("cosine", "wsd", "constant")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "fp32", "bf16")
COMPILE_MODES = ("auto", "true", "false")
PARALLEL = ("ddp", "fsdp")


@dataclass(frozen=True)
class OptimConfig:
    """optim.*: AdamW with a learning-rate schedule (conf/optim/adamw.yaml is these defaults)."""

    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1  # applied to matrices and the embedding, not to norm gains or biases
    grad_clip: float | None = 1.0  # global L2 norm; null disables
    schedule: str = "cosine"  # cosine | wsd | constant
    warmup_frac: float = 0.05  # fraction of steps with linear warmup
    decay_frac: float = 0.2  # wsd only: fraction of steps in the final linear decay
    min_lr_ratio: float = 0.1  # final lr = lr * min_lr_ratio

    def __post_init__(self) -> None:
        require(isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0, "optim.lr", self.lr, "must be a number > 0")
        require(isinstance(self.betas, list | tuple) and len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                "optim.betas", self.betas, "two numbers in [0, 1)")
        object.__setattr__(self, "betas", tuple(self.betas))
        require(self.eps >= 0, "optim.eps", self.eps, "must be >= 0")
        require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        require(self.grad_clip is None or self.grad_clip > 0, "optim.grad_clip", self.grad_clip, "must be > 0 or null")
        require(self.schedule in SCHEDULES, "optim.schedule", self.schedule, f"one of {list(SCHEDULES)}")
        require(0 <= self.warmup_frac < 1, "optim.warmup_frac", self.warmup_frac, "must be in [0, 1)")
        require(0 < self.decay_frac <= 1, "optim.decay_frac", self.decay_frac, "must be in (0, 1]")
        require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")


@dataclass(frozen=True)
class TrainConfig:
    """train.*: the budget, evaluation, probes and where it runs. The defaults are conf/train/cpu.yaml,
    sized so one micro trial takes about a minute on one CPU core."""

    seed: int = 0  # data order (conf/config.yaml sets it to the top-level seed)
    batch_size: int = 16
    seq_len: int = 128
    grad_accum: int = 1
    max_tokens: int | None = 122_880  # budget in tokens (60 steps) ...
    max_steps: int | None = None  # ... or in optimizer steps (wins when set)
    # ... or per parameter (Chinchilla's rule of thumb is 20; wins over both): sets max_tokens
    # from the model's size when the trial is built (active parameters without the attention
    # gate, so the arms of one size train the same tokens and pair).
    tokens_per_param: float | None = None
    # The most passes over the corpus's training tokens a budget may take (checked before launch,
    # trainer/data_check.py): past a few, a run measures memorisation, not the paper's question.
    max_epochs: float | None = 4
    eval_every: int = 25  # steps between validation passes
    # Steps between training rows (loss, lr, grad norm, tokens/s) in metrics.jsonl, the console
    # and W&B; 0 logs them only with each evaluation. Evaluation keeps its own cadence.
    log_every: int = 5
    eval_tokens: int = 16384  # fixed validation tokens scored at each pass
    per_token_eval_tokens: int = 16384  # tokens whose per-token losses are saved at the end
    probe_every: int = 25  # steps between probes (0 disables)
    probe_batch: int = 2  # sequences the activation probes see
    ckpt_every: int = 50  # steps between checkpoints (0 = only at the end)
    # false: the finished trial keeps no model.pt. A long record whose losses are its result
    # then keeps its finished trials in a few KB each, small enough to carry between machines
    # (records/keep.py); export needs the weights. Storage: not in the identity.
    keep_weights: bool = True
    device: str = "auto"  # auto | cpu | cuda
    # auto: bf16 autocast on CUDA and on CPUs with fast bf16 matmuls, else fp32 (trainer/machine/precision.py).
    dtype: str = "auto"
    # auto: compile where the run is long enough to repay it, timed on this machine
    # (trainer/machine/compile_choice.py); true | false force it.
    compile: str = "auto"
    threads: int | None = None  # torch intra-op threads (null = torch's default)
    peak_tflops: float | None = None  # for MFU; null = known GPUs only (H100/H200/A100), CPU reports none
    # With ray.workers_per_trial > 1: how the workers share the model (trainer/distributed.py):
    # ddp keeps a whole copy on each, fsdp shards it per block. Hardware: not in the identity.
    parallel: str = "ddp"
    # Several token budgets from one run (trainer/schedule.py): strictly increasing, each a
    # whole number of steps; the largest replaces max_tokens. Each budget's cooldown is
    # cooldown_frac of its steps. Null: one budget, max_tokens or max_steps.
    budgets: tuple[int, ...] | None = None
    cooldown_frac: float = 0.2
    # End the run at this budget (one of train.budgets): it trains that budget and the smaller
    # ones, each the same branch, step for step, that the whole plan's run takes (the warmup
    # stays warmup_frac of the largest budget), and the larger budgets get no result. A
    # select-then-confirm sweep sets it where a value was chosen only for smaller budgets
    # (hydra.sweeper.protocol.confirm_to_chosen). Null (or the largest budget): every budget.
    stop_after: int | None = None
    # Budgets as tokens per parameter, e.g. [5, 10, 20]: they become train.budgets (each
    # rounded down to whole steps) when the trial is built, so one sweep over sizes gets each
    # size's own. Parameters of the model's shape (active, embedding and head included) without
    # the attention gate, so every arm of a size trains the same budgets and the report pairs them.
    budgets_per_param: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for key in ("batch_size", "seq_len", "grad_accum", "eval_every", "probe_batch"):
            value = getattr(self, key)
            require(isinstance(value, int) and value > 0, f"train.{key}", value, "must be a positive integer")
        for key in ("eval_tokens", "per_token_eval_tokens", "probe_every", "ckpt_every", "log_every", "seed"):
            value = getattr(self, key)
            require(isinstance(value, int) and value >= 0, f"train.{key}", value, "must be an integer >= 0")
        # As init.seed: the eval sampler seeds a torch.Generator (64 bits) with seed * 1_000_003 + i,
        # and results.parquet holds the seed as int64.
        require(self.seed < 2**32, "train.seed", self.seed, "must be an integer in [0, 2^32)")
        require(self.tokens_per_param is None or (isinstance(self.tokens_per_param, int | float) and self.tokens_per_param > 0),
                "train.tokens_per_param", self.tokens_per_param, "must be > 0 or null")
        require(isinstance(self.cooldown_frac, int | float) and 0 < self.cooldown_frac < 1,
                "train.cooldown_frac", self.cooldown_frac, "must be a number in (0, 1)")
        if self.budgets_per_param is not None:
            k = self.budgets_per_param
            require(isinstance(k, list | tuple) and len(k) > 0 and all(
                isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in k)
                and all(x < y for x, y in zip(k, k[1:])), "train.budgets_per_param", k,
                "a strictly increasing list of positive numbers (tokens per parameter), or null")
            require(self.budgets is None, "train.budgets", self.budgets, "must be null with train.budgets_per_param")
            require(self.tokens_per_param is None, "train.tokens_per_param", self.tokens_per_param,
                    "must be null with train.budgets_per_param")
            require(self.max_steps is None, "train.max_steps", self.max_steps, "must be null with train.budgets_per_param")
            object.__setattr__(self, "budgets_per_param", tuple(k))
        if self.budgets is not None:
            self._take_budgets()
        else:
            require(self.stop_after is None, "train.stop_after", self.stop_after, "must be null without train.budgets")
        require(
            self.max_tokens is not None or self.max_steps is not None,
            "train.max_tokens",
            self.max_tokens,
            "set train.max_tokens or train.max_steps",
        )
        if self.max_steps is not None:
            require(isinstance(self.max_steps, int) and self.max_steps > 0, "train.max_steps", self.max_steps, "must be a positive integer")
        elif self.max_tokens is not None:
            require(
                isinstance(self.max_tokens, int) and self.max_tokens >= self.tokens_per_step,
                "train.max_tokens",
                self.max_tokens,
                f"must be an integer >= one step's tokens (batch_size*seq_len*grad_accum = {self.tokens_per_step})",
            )
        require(self.device in DEVICES, "train.device", self.device, f"one of {list(DEVICES)}")
        require(self.dtype in DTYPES, "train.dtype", self.dtype, f"one of {list(DTYPES)}")
        # Hydra hands `train.compile=true` over as a boolean, which the str field holds as "True".
        object.__setattr__(self, "compile", str(self.compile).strip().lower())
        require(self.compile in COMPILE_MODES, "train.compile", self.compile, f"one of {list(COMPILE_MODES)}")
        require(isinstance(self.keep_weights, bool), "train.keep_weights", self.keep_weights, "true or false")
        require(self.parallel in PARALLEL, "train.parallel", self.parallel, f"one of {list(PARALLEL)}")
        require(self.threads is None or self.threads > 0, "train.threads", self.threads, "must be > 0 or null")
        require(self.max_epochs is None or (isinstance(self.max_epochs, int | float) and self.max_epochs > 0),
                "train.max_epochs", self.max_epochs, "must be a number > 0 or null (no limit)")

    def _take_budgets(self) -> None:
        """Check train.budgets; its largest becomes max_tokens (the field is frozen, hence
        object.__setattr__, as in a dataclass's own __post_init__ idiom)."""
        b, tps = self.budgets, self.tokens_per_step
        require(isinstance(b, list | tuple) and len(b) > 0
                and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in b),
                "train.budgets", b, "a non-empty list of positive integers (tokens), or null")
        require(all(x < y for x, y in zip(b, b[1:])), "train.budgets", list(b), "must be strictly increasing")
        require(all(x % tps == 0 for x in b), "train.budgets", list(b),
                f"each must be a multiple of one step's tokens (batch_size*seq_len*grad_accum = {tps})")
        require(self.max_steps is None, "train.max_steps", self.max_steps, "must be null with train.budgets (budgets are in tokens)")
        require(self.tokens_per_param is None, "train.tokens_per_param", self.tokens_per_param, "must be null with train.budgets")
        smallest = b[0] // tps
        require(int(self.cooldown_frac * smallest) >= 1, "train.cooldown_frac", self.cooldown_frac,
                f"must give the smallest budget ({b[0]} tokens, {smallest} steps) at least one cooldown step")
        object.__setattr__(self, "budgets", tuple(b))
        s = self.stop_after
        require(s is None or s in b, "train.stop_after", s, f"null or one of train.budgets {list(b)}")
        object.__setattr__(self, "stop_after", None if s == b[-1] else s)  # the whole plan: one trial, one identity
        object.__setattr__(self, "max_tokens", b[-1] if s is None else s)

    @property
    def budgets_trained(self) -> tuple[int, ...]:
        """The budgets this run trains: train.budgets up to train.stop_after (all of them without it)."""
        return tuple(x for x in self.budgets or () if x <= self.max_tokens)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum

    @property
    def total_steps(self) -> int:
        if self.max_steps is not None:
            return self.max_steps
        return self.max_tokens // self.tokens_per_step


@dataclass(frozen=True)
class TrialConfig:
    model: ModelConfig
    optim: OptimConfig
    train: TrainConfig
    data: DataConfig = field(default_factory=BilingualData)
    preset: str | None = None

    def __post_init__(self) -> None:
        if self.train.budgets is None:
            return
        require(self.optim.schedule == "wsd", "optim.schedule", self.optim.schedule,
                "must be wsd with train.budgets (each budget ends in a WSD cooldown)")
        branches = budget_branches(self.train.budgets, self.train.tokens_per_step, self.train.cooldown_frac)
        warmup = budget_warmup(branches, self.optim)
        require(warmup <= branches[0].fork, "optim.warmup_frac", self.optim.warmup_frac,
                f"must end the warmup ({warmup} steps: a fraction of the largest budget) by step {branches[0].fork}, "
                f"where the smallest budget's cooldown starts")

    @property
    def task(self) -> str:
        return self.data.task

    def to_dict(self) -> dict[str, Any]:
        return {f.name: self.data.to_dict() if f.name == "data" else plain(getattr(self, f.name))
                for f in dataclasses.fields(self)}

    def identity(self, workers: int = 1) -> str:
        """Hash of what determines the trial's numbers. Hardware, paths, logging and guards
        (device, threads, compile, parallel, cache_dir, peak_tflops, log_every, max_epochs,
        keep_weights) are
        left out: the same trial on another machine, logged more densely or allowed more passes,
        is the same trial. The worker count that trains it (ray.workers_per_trial, or the one
        ray.fit_device_gib chose) is in when above 1: the all-reduce sums the gradient in
        another order than one process does, and over hundreds of steps the losses part
        (docs/sweeps.md), so N workers' result is its own trial's. One worker adds nothing:
        every identity from before keeps its value (tests/test_identities.py)."""
        d = self.to_dict()
        if workers > 1:
            d["workers"] = workers
        for key in ("device", "threads", "compile", "parallel", "peak_tflops", "log_every", "max_epochs", "keep_weights"):
            d["train"].pop(key, None)
        d["data"].pop("cache_dir", None)
        if not d["data"].get("val_paths"):  # added later: trials run on token files before keep their identity
            d["data"].pop("val_paths", None)
        if d["train"].get("budgets") is None:  # added later: trials with one budget keep their identity
            d["train"].pop("budgets", None)
            d["train"].pop("cooldown_frac", None)
        if d["train"].get("budgets_per_param") is None:  # resolved into budgets, which the identity holds
            d["train"].pop("budgets_per_param", None)
        if d["train"].get("stop_after") is None:  # added later: a run of the whole plan keeps its identity
            d["train"].pop("stop_after", None)
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def workers_of(self, identity: str, most: int = 64) -> int | None:
        """The worker count (1 to `most`) that makes this trial `identity`; None for another trial."""
        return next((n for n in range(1, most + 1) if self.identity(n) == identity), None)


@dataclass(frozen=True)
class TrialArgs:
    """What a user sets, as conf/ holds it; `build()` makes the trial. The defaults are the
    command line's: TrialArgs().build() is the trial `python sweep.py` trains."""

    model: ModelPreset = field(default_factory=ModelPreset)
    init: InitConfig = field(default_factory=InitConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    attn: AttnConfig = field(default_factory=AttnConfig)
    data: DataConfig = field(default_factory=BilingualData)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> TrialArgs:
        """From a composed config as a plain dict, its keys and types already checked against
        this schema by Hydra; the keys that are not the trial's (name, seed, ray, ...) are ignored."""
        model = dict(cfg["model"])
        ffn = _ffn(model.pop("ffn", None))
        return cls(model=ModelPreset(**model, ffn=ffn),
                   data=data_config_from_dict(cfg["data"]), train=TrainConfig(**cfg["train"]),
                   norm=NormConfig(**cfg["norm"]), attn=AttnConfig(**cfg["attn"]), init=InitConfig(**cfg["init"]),
                   optim=OptimConfig(**cfg["optim"]))

    def build(self) -> TrialConfig:
        """The trial: the preset's shape with its overrides (ModelPreset.build), the data's
        vocabulary, and a budget per parameter turned into tokens of this model."""
        data, train = self.data, self.train
        model = self.model.build(data.vocab_size, train.seq_len, norm=self.norm, attn=self.attn, init=self.init)
        require(model.vocab_size >= data.vocab_size, "model.vocab_size", model.vocab_size,
                f"must be >= the data's vocabulary ({data.vocab_size})")
        if train.tokens_per_param is not None:  # counted without the gate, as budgets_per_param: arms of a size pair
            budget = int(train.tokens_per_param * model.replace(attn=AttnConfig()).num_params(active=True))
            train = dataclasses.replace(train, max_tokens=max(budget, train.tokens_per_step), max_steps=None)
        if train.budgets_per_param is not None:
            n, tps = model.replace(attn=AttnConfig()).num_params(active=True), train.tokens_per_step
            budgets = [max(1, int(k * n) // tps) * tps for k in train.budgets_per_param]
            train = dataclasses.replace(train, budgets=budgets, budgets_per_param=None, max_steps=None)
        require(train.seq_len <= model.max_seq_len, "train.seq_len", train.seq_len, f"must be <= model.max_seq_len ({model.max_seq_len})")
        return TrialConfig(model=model, optim=self.optim, train=train, data=data, preset=self.model.preset)


def _ffn(given: Any) -> FFNConfig | None:
    """model.ffn, which the schema leaves untyped (sweeper/config/schema.py): null, or a mapping of
    FFNConfig's keys."""
    if given is None:
        return None
    known = [f.name for f in dataclasses.fields(FFNConfig)]
    require(isinstance(given, Mapping) and set(given) <= set(known), "model.ffn", given,
            f"null (the preset's) or a mapping of {known}")
    return FFNConfig(**given)


def trial_config_from_dict(cfg: Mapping[str, Any]) -> TrialConfig:
    """The trial of a composed config (the resolved Hydra config as a plain dict), as sweep.py,
    the sweeper and --show build it. Raises ConfigError naming key, value and what is allowed."""
    return TrialArgs.from_dict(cfg).build()


def flops_per_token(trial: TrialConfig) -> float:
    """Training FLOPs per token of the trial (core.flops): its matmul parameters are the active
    ones less the embedding lookup (a tied LM head still counts)."""
    m = trial.model
    n_matmul = m.num_params(active=True) - m.vocab_size * m.d_model * (0 if m.tie_embeddings else 1)
    return float(training_flops_per_token(n_matmul, m.n_layers, m.d_model, trial.train.seq_len))
