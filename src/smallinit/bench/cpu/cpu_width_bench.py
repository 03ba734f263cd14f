"""cpu_mfu_by_width: training throughput and CPU MFU of the scaling_law record's model shape
(conf/experiment/scaling_law.yaml: micro, 4 layers, heads of 32, batch 8 x seq 128) at each of
its widths, since that sets the record's cost.

MFU = model FLOPs/s (PaLM's count, trainer.config.flops_per_token: 6 x the matmul parameters,
head included, + attention's 12 L d T, per token, x the bare loop's tokens/s over its steps'
own time) / the best GFLOP/s of a large square matmul in the same dtype and threads. The peak
is timed just before and just after each width's steps (the best of both), so machine load
hits both sides of each ratio; the
figure per width is the median of those paired ratios over repeats, the headline the lowest
width's (eager: the bare loop as the trainer ran before train.compile=auto); each width's compiled
reference (bench/base/bare.py through torch.compile, the form trainer_vs_reference holds the
trainer to) is timed beside it with its own MFU. The dtype is what train.dtype=auto picks for the record on this CPU: bf16 where the
CPU has native bf16 and it pays, else fp32, and the entry says why.
"""

from __future__ import annotations

import torch

from ..base.bare import bare_loop
from ..base.common import compose_trial, median, prepared_data, progress, rotate, spread
from .cpu_bench import MFU_TARGET, matmul_peak

EXPERIMENT = "+experiment=scaling_law"
COMPILE_WARMUP = 3  # compiled steps before the timed ones: the compile, and the kernels' first calls


def run(settings) -> dict:
    from smallinit.trainer.config import flops_per_token
    from smallinit.trainer.machine.precision import native_bf16_flags, resolve_dtype

    name = "cpu_mfu_by_width"
    torch.set_num_threads(settings.threads)
    choice = resolve_dtype(torch.device("cpu"), "auto")
    dt = choice.dtype
    trials = {d: compose_trial(EXPERIMENT, f"model.d_model={d}", f"train.dtype={dt}", "train.device=cpu",
                               f"train.threads={settings.threads}") for d in settings.cpu_widths}
    data = prepared_data(next(iter(trials.values())))
    first = next(iter(trials.values()))
    progress(name, f"{EXPERIMENT} ({first.preset}, {first.model.n_layers} layers, heads of {first.model.head_dim}, "
                   f"batch {first.train.batch_size} x seq {first.train.seq_len}), d = {list(trials)}, "
                   f"{settings.cpu_width_steps} steps each, {dt} ({choice.reason}), {settings.threads} thread(s)")
    for trial in trials.values():  # warm-up (untimed): kernels and allocator at every shape
        bare_loop(trial, data, steps=1)
    runs: dict[int, list[dict]] = {d: [] for d in trials}
    for r in range(settings.repeats):
        for d in rotate(list(trials), r):
            before = matmul_peak(dt, settings.cpu_peak_n)
            out = bare_loop(trials[d], data, steps=settings.cpu_width_steps)
            # The reference form: compiled, its first steps (compilation) untimed.
            compiled = bare_loop(trials[d], data, steps=settings.cpu_width_steps, compile=True, warmup=COMPILE_WARMUP)
            peak = max(before, matmul_peak(dt, settings.cpu_peak_n))
            tok_s, tok_c = out["tokens"] / out["steps_s"], compiled["tokens"] / compiled["steps_s"]
            mfu, mfu_c = (x * flops_per_token(trials[d]) / (peak * 1e9) for x in (tok_s, tok_c))
            runs[d].append({"tokens_per_s": tok_s, "matmul_gflops": peak, "mfu": mfu,
                            "compiled_tokens_per_s": tok_c, "compiled_mfu": mfu_c})
            progress(name, f"repeat {r + 1}/{settings.repeats} d={d}: eager {tok_s:,.0f} tokens/s, MFU {mfu:.3f}; "
                           f"compiled {tok_c:,.0f}, MFU {mfu_c:.3f} of {peak:.0f} GFLOP/s")
    widths = {}
    for d, trial in trials.items():
        mfus = [x["mfu"] for x in runs[d]]
        widths[str(d)] = {
            "mfu": median(mfus), "pass": median(mfus) >= MFU_TARGET["value"], "spread": spread(mfus),
            "tokens_per_s": median(x["tokens_per_s"] for x in runs[d]),
            "compiled_mfu": median(x["compiled_mfu"] for x in runs[d]),
            "compiled_tokens_per_s": median(x["compiled_tokens_per_s"] for x in runs[d]),
            "matmul_gflops": median(x["matmul_gflops"] for x in runs[d]),
            "flops_per_token": flops_per_token(trial),
            "params": trial.model.num_params(), "n_heads": trial.model.n_heads, "runs": runs[d],
        }
    ratio = min(w["mfu"] for w in widths.values())
    return {
        "ratio": ratio, "target": MFU_TARGET, "pass": ratio >= MFU_TARGET["value"], "repeats": settings.repeats,
        "metric": f"bare-loop model FLOPs/s (PaLM's count, steps' own time) / the best GFLOP/s of a "
                  f"{settings.cpu_peak_n}^3 matmul timed before and after the steps, same dtype ({dt}) and threads "
                  f"({settings.threads}); median over repeats per width, the lowest width's as the figure",
        "baseline": {"n": settings.cpu_peak_n, "dtype": dt},
        "measured": {"steps": settings.cpu_width_steps, "tokens_per_step": first.train.tokens_per_step},
        "widths": widths, "dtype": dt, "dtype_reason": choice.reason, "native_bf16": bool(native_bf16_flags()),
        "note": None if dt == "bf16" else "fp32: train.dtype=auto does not pick bf16 on this CPU "
                                          f"({choice.reason}), so the record would train in fp32",
    }
