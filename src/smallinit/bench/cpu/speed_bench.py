"""The trainer at the CPU's speed, held to a reference it cannot beat by accident.

trainer_vs_reference: the steady-state training rate of `run_trial` (train.compile=true, the
    dtype train.dtype=auto picks here) over the reference loop's: bench/base/bare.py through
    torch.compile, same dtype, fused AdamW (the trainer's make_optimizer), the same model, data and
    schedule, nothing else. Both skip their first `warmup` steps (compilation, kernel choice): the
    trainer's rate is its logged perf/tokens_per_s rows after them. At d = 128 (the crossover's
    model) and d = 256 (micro, what `make sweep` trains); the figure is the lower ratio. The
    reference's tokens/s stands beside the matmul peak of the same dtype (its MFU).
crossover_end_to_end: the crossover's trial (conf/experiment/bf16_gap.yaml, the recipe arm, 4,096
    steps) end to end, `run_trial` called to returned, with train.compile=auto and train.dtype=auto
    against train.compile=false train.dtype=fp32 (how the committed crossover record trained): the
    wall-time ratio, with the choices and reasons the trainer recorded.
cpu_precision_check: the figure train.dtype=auto decides by (precision.timed_bf16_ratio) against
    a plain timing of the same matmul (torch.utils.benchmark's blocked_autorange, each dtype):
    the check must agree with it within 20%.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

from smallinit.core.metrics_log import metrics_rows

from ..base.bare import bare_loop
from ..base.common import compose_trial, median, prepared_data, progress, rotate, spread
from .cpu_bench import matmul_peak

REFERENCE_TARGET = {"op": ">=", "value": 0.95}
END_TO_END_TARGET = {"op": ">=", "value": 1.7}
PRECISION_TARGET = {"op": "<=", "value": 0.2}
SHAPES = {"crossover": ("+experiment=bf16_gap", "arm=small"), "micro": ()}  # the crossover's model; `make sweep`'s


def _trainer_rate(trial, root: Path, warmup: int) -> tuple[float, dict]:
    """run_trial's tokens/s over its logged rows after `warmup` steps, and its made_by."""
    from smallinit.trainer.loop import run_trial

    out = Path(tempfile.mkdtemp(dir=root))
    try:
        result = run_trial(trial, out, log=lambda *_: None)
        rows = metrics_rows(out / "metrics.jsonl")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    rates = [r["perf/tokens_per_s"] for r in rows if "perf/tokens_per_s" in r and r["step"] > warmup]
    return median(rates), result.made_by or {}


def trainer_vs_reference(settings) -> dict:
    from smallinit.trainer.config import flops_per_token
    from smallinit.trainer.machine.precision import resolve_dtype

    name = "trainer_vs_reference"
    torch.set_num_threads(settings.threads)
    dt = resolve_dtype(torch.device("cpu"), "auto")
    warmup, steps = settings.speed_warmup, settings.speed_steps
    root = Path(tempfile.mkdtemp(prefix="smallinit-bench-speed-"))
    shapes = {}
    try:
        for d, extra in SHAPES.items():
            common = (*settings.trial_overrides, *extra, f"train.dtype={dt.dtype}", "train.device=cpu",
                      f"train.threads={settings.threads}", f"train.max_steps={warmup + steps}")
            reference = compose_trial(*common)
            trainer = compose_trial(*common, "train.compile=true", f"train.log_every={warmup}",
                                    f"train.eval_every={warmup + steps}", "train.probe_every=0", "train.ckpt_every=0")
            data = prepared_data(reference)
            runs = {"reference": [], "trainer": []}
            for r in range(settings.repeats):
                for side in rotate(list(runs), r):
                    # Each run compiles afresh, as a trial's process does: dynamo's cache of one
                    # process fills with every model compiled before (its limit then runs eager).
                    torch._dynamo.reset()
                    if side == "reference":
                        peak = matmul_peak(dt.dtype, settings.cpu_peak_n)
                        out = bare_loop(reference, data, steps=steps, compile=True, warmup=warmup)
                        tok_s = out["tokens"] / out["steps_s"]
                        runs[side].append({"tokens_per_s": tok_s, "matmul_gflops": peak,
                                           "mfu": tok_s * flops_per_token(reference) / (peak * 1e9)})
                    else:
                        tok_s, _ = _trainer_rate(trainer, root, warmup)
                        runs[side].append({"tokens_per_s": tok_s})
                    progress(name, f"d={d} repeat {r + 1}/{settings.repeats} {side}: {tok_s:,.0f} tokens/s")
            ratios = [t["tokens_per_s"] / b["tokens_per_s"] for t, b in zip(runs["trainer"], runs["reference"], strict=True)]
            shapes[d] = {"ratio": median(ratios), "spread": spread(ratios),
                         "reference_tokens_per_s": median(x["tokens_per_s"] for x in runs["reference"]),
                         "trainer_tokens_per_s": median(x["tokens_per_s"] for x in runs["trainer"]),
                         "reference_mfu": median(x["mfu"] for x in runs["reference"]),
                         "matmul_gflops": median(x["matmul_gflops"] for x in runs["reference"]),
                         "model": f"d={reference.model.d_model}, {reference.model.n_layers} layers, "
                                  f"batch {reference.train.batch_size} x {reference.train.seq_len}, "
                                  f"gate {reference.model.attn.gate}", "runs": runs}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = min(s["ratio"] for s in shapes.values())
    return {
        "ratio": ratio, "target": REFERENCE_TARGET, "pass": ratio >= REFERENCE_TARGET["value"],
        "repeats": settings.repeats, "dtype": dt.dtype, "dtype_reason": dt.reason,
        "metric": f"run_trial's tokens/s (train.compile=true, its logged rows after {warmup} warm-up steps) / the "
                  f"reference loop's (bench/base/bare.py compiled, fused AdamW, {steps} steps after {warmup}), same "
                  f"dtype ({dt.dtype}) and threads ({settings.threads}); median of paired ratios, the lower width's",
        "baseline": {"loop": "bench/base/bare.py, torch.compile", "steps": steps, "warmup": warmup},
        "shapes": shapes,
    }


def crossover_end_to_end(settings) -> dict:
    name = "crossover_end_to_end"
    torch.set_num_threads(settings.threads)
    base = (*settings.end_to_end_overrides, "train.device=cpu", f"train.threads={settings.threads}")
    sides = {"eager_fp32": ("train.compile=false", "train.dtype=fp32"), "auto": ("train.compile=auto", "train.dtype=auto")}
    trials = {k: compose_trial(*base, *v) for k, v in sides.items()}
    data = prepared_data(trials["auto"])
    root = Path(tempfile.mkdtemp(prefix="smallinit-bench-e2e-"))
    got = {}
    try:
        from smallinit.trainer.loop import run_trial

        for side, trial in trials.items():
            torch._dynamo.reset()
            out = Path(tempfile.mkdtemp(dir=root))
            t0 = time.perf_counter()
            result = run_trial(trial, out, log=lambda *_: None, prepared=data)
            wall = time.perf_counter() - t0
            shutil.rmtree(out, ignore_errors=True)
            got[side] = {"wall_s": wall, "tokens_per_s": result.tokens_per_s, "final_val_loss": result.final_val_loss,
                         "dtype": result.dtype, "dtype_reason": (result.made_by or {}).get("dtype"),
                         "compile": (result.made_by or {}).get("compile")}
            progress(name, f"{side}: {wall:.0f} s, {result.tokens_per_s:,.0f} tokens/s in steps, {got[side]['compile']}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = got["eager_fp32"]["wall_s"] / got["auto"]["wall_s"]
    steps = trials["auto"].train.total_steps
    return {
        "ratio": ratio, "target": END_TO_END_TARGET, "pass": ratio >= END_TO_END_TARGET["value"], "repeats": 1,
        "metric": f"wall time of the crossover's trial ({steps} steps, evaluation and probes at its cadence, run_trial "
                  "called to returned) at train.compile=false train.dtype=fp32 / at train.compile=auto train.dtype=auto",
        "baseline": got["eager_fp32"], "measured": got["auto"],
        "steps_ratio": got["auto"]["tokens_per_s"] / got["eager_fp32"]["tokens_per_s"],
    }


def cpu_precision_check(settings) -> dict:
    from torch.utils.benchmark import Timer

    from smallinit.trainer.machine.precision import PROBE_SHAPE, native_bf16_flags, timed_bf16_ratio

    torch.set_num_threads(settings.threads)
    m, k, n = PROBE_SHAPE
    plain = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        seconds = Timer("a @ b", globals={"a": a, "b": b}, num_threads=settings.threads).blocked_autorange(min_run_time=1.0).median
        plain[str(dtype)] = 2 * m * k * n / seconds / 1e9
    fp32, bf16 = timed_bf16_ratio()
    check, reference = bf16 / fp32, plain[str(torch.bfloat16)] / plain[str(torch.float32)]
    off = abs(check / reference - 1)
    progress("cpu_precision_check", f"the check's bf16/fp32 {check:.2f}x, a plain timing's {reference:.2f}x")
    return {
        "ratio": off, "target": PRECISION_TARGET, "pass": off <= PRECISION_TARGET["value"], "repeats": 1,
        "metric": f"|the dtype check's bf16/fp32 matmul ratio / torch.utils.benchmark's (blocked_autorange, 1 s a dtype) - 1|, "
                  f"{m}x{k}x{n}, {settings.threads} thread(s)",
        "baseline": {"plain_gflops": plain, "plain_ratio": reference},
        "measured": {"fp32_gflops": fp32, "bf16_gflops": bf16, "check_ratio": check},
        "native_bf16": bool(native_bf16_flags()),
    }
