"""What the benchmarks share: the settings of a full or tiny run, the trial config they train,
the prepared corpus, timing helpers and the description of the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smallinit.core import provenance as prov

REPO = Path(__file__).resolve().parents[4]
CONF = REPO / "src" / "smallinit" / "conf"


@dataclass(frozen=True)
class Settings:
    """One bench run. `full` is the real default trial (micro on the bundled corpus, the
    default train config); `tiny` shrinks everything so CI can check the output in minutes."""

    mode: str
    # Overrides on conf/config.yaml for the trial that trainer_vs_bare and probe_overhead run.
    trial_overrides: tuple[str, ...]
    repeats: int
    # torch threads in every measured run, baseline and instrument alike. One by default:
    # with other work on the cores, 2-thread OpenMP steps stall at every barrier (we measured
    # 6 s steps against 0.7 s single-threaded on a loaded 2-core machine), and a sweep trial
    # runs with ray.cpus_per_trial = 1 thread anyway.
    threads: int
    # sweep_overhead: short trials (the default model, few steps, the same cadences in steps).
    sweep_overrides: tuple[str, ...]
    sweep_sizes: tuple[int, ...]
    sweep_headline: int  # the trial count the headline ratio is taken at
    sweep_repeats: int  # repeats of the headline point; other sizes run once
    concurrency: int
    sweep_wandb_disabled: bool  # also time the headline sweep with wandb.mode=disabled
    data_cold_repeats: int
    data_warm_repeats: int
    # data_prep on the first N documents of the bundled corpus, as a text corpus (the same BPE
    # training and tokenising); None: the bundled corpus whole, as a trial prepares it.
    data_docs: int | None = None
    # sweep_overhead also times `make sweep` itself (its grid on the default trials; the
    # Makefile's SWEEP_GRID, checked by tests/test_bench.py) against its pool ideal. Empty: skip.
    make_sweep_grid: tuple[str, ...] = ()
    make_sweep_overrides: tuple[str, ...] = ()  # on top of the defaults (--tiny shrinks the trials)
    # dp_scaling: the trial (overrides on conf/config.yaml) that `sweep.py -m` trains as 2 workers
    # x 1 thread and as 1 worker x 2 threads; empty is the default trial.
    dp_overrides: tuple[str, ...] = ()
    # cpu_bf16_speedup: bare-loop steps per dtype; cpu_mfu: the side of the peak matmul.
    cpu_steps: int = 10
    cpu_peak_n: int = 2048
    # cpu_mfu_by_width: the scaling_law record's widths, bare-loop steps timed per width.
    cpu_widths: tuple[int, ...] = (64, 96, 128, 192)
    cpu_width_steps: int = 3
    compile_cold: bool = True  # cpu_compile also times a compile into an empty inductor cache
    # trainer_vs_reference: steps each side trains before its rate is taken, and after.
    speed_warmup: int = 32
    speed_steps: int = 96
    # crossover_end_to_end: the trial timed whole both ways (the crossover's model and cadence).
    end_to_end_overrides: tuple[str, ...] = ("+experiment=bf16_gap", "arm=small", "optim.lr=1e-3", "seed=1")
    gpu_presets: tuple[str, ...] = ("0.1b", "0.5b", "1.5b")
    gpu_steps: int = 10
    extra: dict[str, Any] = field(default_factory=dict)


FULL = Settings(
    mode="full",
    trial_overrides=(),
    repeats=3,
    threads=1,
    sweep_overrides=("train.max_steps=4", "train.eval_every=2", "train.probe_every=2", "train.ckpt_every=2",
                     "train.eval_tokens=2048", "train.per_token_eval_tokens=2048"),
    sweep_sizes=(4, 8, 16),
    sweep_headline=8,
    sweep_repeats=2,
    concurrency=2,
    sweep_wandb_disabled=True,
    data_cold_repeats=2,
    data_warm_repeats=5,
    make_sweep_grid=("init.gamma=0.5,0.75,1.0,1.25", "norm.eps=1e-5,1e-12", "seed=0,1,2"),
)

# The tiny run's sweep trials, for both its short-trial sweeps and its `make sweep` point.
_TINY_SWEEP_TRIAL = ("model=nano", "train.batch_size=4", "train.seq_len=32", "train.max_steps=4",
                     "train.eval_every=2", "train.eval_tokens=256", "train.per_token_eval_tokens=128",
                     "train.probe_every=2", "train.ckpt_every=2")

TINY = Settings(
    mode="tiny",
    trial_overrides=("model=nano", "train.batch_size=4", "train.seq_len=32", "train.max_tokens=1024",
                     "train.eval_every=4", "train.eval_tokens=512", "train.per_token_eval_tokens=256",
                     "train.probe_every=4", "train.ckpt_every=4"),
    repeats=1,
    threads=1,
    sweep_overrides=_TINY_SWEEP_TRIAL,
    sweep_sizes=(2, 4),
    sweep_headline=2,
    sweep_repeats=1,
    concurrency=2,
    sweep_wandb_disabled=False,
    data_cold_repeats=1,
    data_warm_repeats=3,
    data_docs=200,  # ~7% of its tokens: the cold prepare takes seconds, not a minute
    make_sweep_grid=("init.gamma=0.5,1.0",),
    make_sweep_overrides=_TINY_SWEEP_TRIAL,
    dp_overrides=_TINY_SWEEP_TRIAL,
    cpu_steps=2,
    cpu_peak_n=256,
    cpu_widths=(64, 128),
    cpu_width_steps=2,
    compile_cold=False,
    speed_warmup=4,
    speed_steps=4,
    end_to_end_overrides=("+experiment=bf16_gap", "arm=small", "model=nano", "train.batch_size=4", "train.seq_len=32",
                          "train.max_tokens=1024", "train.eval_every=4", "train.eval_tokens=512",
                          "train.per_token_eval_tokens=256", "train.probe_every=4", "train.ckpt_every=4"),
    gpu_presets=("0.1b",),
    gpu_steps=3,
)


def progress(name: str, message: str) -> None:
    print(f"[bench] {name}: {message}", flush=True)


def cache_dir() -> Path:
    """The corpus cache the benchmarks train from: SMALLINIT_CACHE, else the user default."""
    return Path(os.path.expanduser(os.environ.get("SMALLINIT_CACHE") or "~/.cache/smallinit"))


def compose_trial(*overrides: str):
    """A validated TrialConfig from the real Hydra config, exactly as sweep.py composes it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from smallinit.trainer.config import trial_config_from_dict

    os.environ.setdefault("SMALLINIT_CACHE", str(cache_dir()))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return trial_config_from_dict(OmegaConf.to_container(cfg, resolve=True))


def prepared_data(trial):
    """The trial's corpus, tokenised into the cache if it is not there yet (not timed)."""
    from smallinit.data.pipeline import prepare

    return prepare(trial.data, log=lambda *_: None)


def median(values) -> float:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else float("nan")


def spread(values) -> list[float]:
    """[min, max]: how far the repeats scattered around the median."""
    values = [float(v) for v in values if v is not None]
    return [min(values), max(values)] if values else []


def rotate(items: list, k: int) -> list:
    """The k-th rotation, so each variant takes every position in turn across repeats."""
    k %= len(items)
    return items[k:] + items[:k]


@contextlib.contextmanager
def timed_calls(targets: dict[str, tuple[Any, str]]):
    """Accumulate wall time spent in each target callable (module function or class method)
    while the block runs; yields {name: seconds}. Instrumentation for breakdowns only: the
    code under test is unchanged. A target that no longer exists is skipped."""
    totals: dict[str, float] = {}
    saved = []
    for name, (owner, attr) in targets.items():
        original = getattr(owner, attr, None)
        if original is None:
            continue
        totals[name] = 0.0

        def wrapper(*args, __orig=original, __name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return __orig(*args, **kwargs)
            finally:
                totals[__name] += time.perf_counter() - t0

        saved.append((owner, attr, original))
        setattr(owner, attr, wrapper)
    try:
        yield totals
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpuinfo()[0],
        "torch": torch.__version__,
        "torch_threads_default": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def provenance(machine: dict[str, Any]) -> dict[str, Any]:
    """Where a results entry came from (core/provenance.py: commit, packages, lock file, CPU
    flags), with the bench's own machine keys. Each entry carries its own, so a table of
    entries never has to guess which run one came from."""
    p = prov.record(REPO)
    return {**p, "machine": {**p["machine"], **{k: machine.get(k) for k in ("hostname", "cpu_model", "cpu_count", "gpu", "torch")}}}


def _cpuinfo() -> tuple[str | None, set[str]]:
    model, flags = prov.cpu_identity()
    return model or None, flags
