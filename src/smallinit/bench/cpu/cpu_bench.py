"""CPU throughput against the CPU's own limits, measured in one run.

cpu_bf16_speedup: the bare training loop's tokens/s under bf16 autocast / in fp32, same trial,
    same steps, alternating. Recorded on every CPU; on one without native bf16 instructions the
    bf16 side is emulated (tens of times slower), so it runs fewer steps and the entry says so.
cpu_mfu: run_trial's model FLOPs/s (PaLM's count, trainer.config.flops_per_token, over the
    training steps' own time) / the measured GFLOP/s of a large square matmul in the same dtype
    and thread count: how close training gets to what this CPU can do. Target >= 0.5.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ..base.bare import bare_loop
from ..base.common import compose_trial, median, prepared_data, progress, rotate

MFU_TARGET = {"op": ">=", "value": 0.5}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_peak(dtype: str, n: int, reps: int = 3) -> float:
    """GFLOP/s of an n x n x n matmul in `dtype`, the best of `reps` (the CPU's attainable peak)."""
    a, b = torch.randn(n, n).to(DTYPES[dtype]), torch.randn(n, n).to(DTYPES[dtype])
    a @ b
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return best


def _with_dtype(trial, dtype: str):
    return dataclasses.replace(trial, train=dataclasses.replace(trial.train, dtype=dtype))


def run(settings, selected: set[str]) -> dict[str, dict]:
    from smallinit.trainer.loop import flops_per_token, run_trial
    from smallinit.trainer.machine.precision import native_bf16_flags, resolve_dtype

    name = "cpu"
    torch.set_num_threads(settings.threads)
    trial = compose_trial(*settings.trial_overrides, f"train.threads={settings.threads}", "train.device=cpu")
    data = prepared_data(trial)
    choice = resolve_dtype(torch.device("cpu"), "auto")
    native = bool(native_bf16_flags())
    progress(name, f"{trial.preset}, {settings.threads} thread(s); dtype=auto -> {choice.dtype} ({choice.reason})")
    results: dict[str, dict] = {}
    if "cpu_bf16_speedup" in selected:
        steps = settings.cpu_steps
        # Emulated bf16 runs a micro step in about a minute: one timed step is enough to see it.
        steps_bf16 = steps if native else 1
        runs: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for dt in DTYPES:
            bare_loop(_with_dtype(trial, dt), data, steps=1)  # warm-up: kernels, allocator
        for r in range(settings.repeats):
            for dt in rotate(list(DTYPES), r):
                n = steps if dt == "fp32" else steps_bf16
                out = bare_loop(_with_dtype(trial, dt), data, steps=n)
                runs[dt].append(out["tokens"] / out["steps_s"])
                progress(name, f"repeat {r + 1}/{settings.repeats} {dt}: {runs[dt][-1]:,.0f} tokens/s ({n} steps)")
        ratio = median(runs["bf16"]) / median(runs["fp32"])
        results["cpu_bf16_speedup"] = {
            "ratio": ratio, "target": None, "pass": None,
            "metric": "bare-loop tokens/s under bf16 autocast / in fp32 (steps only, median of alternating repeats)",
            "baseline": {"dtype": "fp32", "tokens_per_s": median(runs["fp32"]), "steps": steps},
            "measured": {"dtype": "bf16", "tokens_per_s": median(runs["bf16"]), "steps": steps_bf16},
            "auto_choice": choice.dtype, "auto_reason": choice.reason, "native_bf16": native,
            "repeats": settings.repeats,
            "note": None if native else "this CPU has no native bf16 instructions: bf16 is emulated, and "
                                        "train.dtype=auto picks fp32 here",
        }
    if "cpu_mfu" in selected:
        dt = choice.dtype
        peak = matmul_peak(dt, settings.cpu_peak_n)
        trial_dt = _with_dtype(trial, dt)
        root = Path(tempfile.mkdtemp(prefix="smallinit-bench-mfu-"))
        try:
            run_trial(dataclasses.replace(trial_dt, train=dataclasses.replace(trial_dt.train, max_steps=2, max_tokens=None)),
                      root / "warm", log=lambda *_: None)
            mfus = []
            for r in range(settings.repeats):
                res = run_trial(trial_dt, root / f"r{r}", log=lambda *_: None, prepared=data)
                mfus.append(res.tokens_per_s * flops_per_token(trial_dt) / (peak * 1e9))
                progress(name, f"repeat {r + 1}/{settings.repeats} run_trial {res.tokens_per_s:,.0f} tokens/s, "
                               f"MFU {mfus[-1]:.2f} of a {settings.cpu_peak_n}^3 matmul's {peak:.0f} GFLOP/s ({dt})")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        ratio = median(mfus)
        results["cpu_mfu"] = {
            "ratio": ratio, "target": MFU_TARGET, "pass": ratio >= MFU_TARGET["value"], "repeats": settings.repeats,
            "metric": f"run_trial model FLOPs/s (6N + 12LdT per token, training steps' own time) / the best GFLOP/s "
                      f"of a {settings.cpu_peak_n}^3 matmul, same dtype ({dt}) and threads ({settings.threads})",
            "baseline": {"matmul_gflops": peak, "n": settings.cpu_peak_n, "dtype": dt},
            "measured": {"flops_per_token": flops_per_token(trial_dt), "repeats": mfus},
        }
    return results
