"""cpu_allocator: the bare training loop with glibc keeping freed memory (trainer/machine/host_memory.py)
against glibc's own behaviour, each in a fresh process.

The setting is process-wide and cannot be undone cleanly, so each side runs in its own child
(`python -m smallinit.bench.cpu.allocator_bench --child ...`) with SMALLINIT_CPU_ALLOCATOR=retain or default,
alternating (ABAB). A child warms up one step, then times `cpu_steps` bare steps and reports
the page faults the kernel served during them (getrusage's minor faults) and the peak RSS of
those steps (VmHWM, reset after the warm-up; kept memory shows up there).
Ratio: retained tokens/s / default tokens/s (> 1: keeping freed memory is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

from smallinit.trainer.machine.host_memory import ENV_SWITCH, USER_ALLOCATOR_VARS

from ..base.common import REPO, median, progress, rotate, spread
from ..base.cpu_account import status_kb

SIDES = ("default", "retain")


def _child(overrides: list[str], steps: int) -> dict:
    from ..base.bare import bare_loop
    from ..base.common import compose_trial, prepared_data

    trial = compose_trial(*overrides)
    data = prepared_data(trial)
    bare_loop(trial, data, steps=1)  # warm-up: kernels, first-call allocations
    _reset_peak_rss()  # the peak below is the timed steps', not the corpus load's
    before = resource.getrusage(resource.RUSAGE_SELF)
    out = bare_loop(trial, data, steps=steps)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"tokens_per_s": out["tokens"] / out["steps_s"], "steps": steps,
            "faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
            "sys_s_per_step": (after.ru_stime - before.ru_stime) / steps,
            "peak_rss_mb": status_kb(os.getpid(), "VmHWM:") / 1024 or after.ru_maxrss / 1024, "process_peak_rss_mb": after.ru_maxrss / 1024}


def _reset_peak_rss() -> None:
    try:  # Linux: "5" resets the process's VmHWM to its current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _run(side: str, overrides: list[str], steps: int, threads: int) -> dict:
    env = {**os.environ, ENV_SWITCH: side, "OMP_NUM_THREADS": str(threads)}
    for var in USER_ALLOCATOR_VARS:
        env.pop(var, None)  # the comparison is glibc's defaults against the trainer's setting
    cmd = [sys.executable, "-m", "smallinit.bench.cpu.allocator_bench", "--child", str(steps), *overrides,
           f"train.threads={threads}", "train.device=cpu"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"allocator_bench child ({side}) failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(settings) -> dict:
    name = "cpu_allocator"
    overrides = list(settings.trial_overrides)
    steps = settings.cpu_steps
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for r in range(settings.repeats):
        for side in rotate(list(SIDES), r):
            out = _run(side, overrides, steps, settings.threads)
            runs[side].append(out)
            progress(name, f"repeat {r + 1}/{settings.repeats} {side:7s}: {out['tokens_per_s']:,.0f} tokens/s, "
                           f"{out['faults_per_step']:,.0f} page faults/step, peak RSS {out['peak_rss_mb']:.0f} MB")
    paired = [m["tokens_per_s"] / b["tokens_per_s"] for b, m in zip(runs["default"], runs["retain"])]

    def summary(side: str) -> dict:
        rs = runs[side]
        return {"allocator": side, "steps": steps, **{k: median(x[k] for x in rs) for k in
                ("tokens_per_s", "faults_per_step", "sys_s_per_step", "peak_rss_mb", "process_peak_rss_mb")}}

    return {"ratio": median(paired), "target": None, "pass": None, "repeats": settings.repeats,
            "paired_ratios": paired, "spread": spread(paired),
            "metric": "bare-loop tokens/s with glibc keeping freed memory (the trainer's setting) / with glibc's "
                      "defaults, each side a fresh process, alternating",
            "baseline": summary("default"), "measured": summary("retain")}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--child", nargs="+", required=True, metavar=("STEPS", "OVERRIDE"))
    args = p.parse_args()
    print(json.dumps(_child(args.child[1:], int(args.child[0]))))
