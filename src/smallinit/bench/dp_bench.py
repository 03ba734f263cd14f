"""dp_scaling: one trial trained by 2 Ray Train workers x 1 thread (DDP, gloo) against the same
trial by 1 worker x 2 threads, both on the CPU.

Both sides are the command a user runs: `sweep.py -m` of the one trial on a local Ray of 2 CPUs
(W&B disabled, ASHA off), from an empty folder, on a prepared corpus cache; only
`ray.workers_per_trial` and `ray.cpus_per_trial` differ, so the 2-worker side goes through the
same Tune trial, TorchTrainer and `run_trial(dist=Parallel("ddp"))` as any
`ray.workers_per_trial=2` sweep (sweeper/worker/trainable.py). The figure compares the trial's own
tokens/s (rank 0's result.json: global tokens over the optimizer steps' time, so Ray, Ray Train
and evaluation are not in it); the sweeps' wall times are reported beside it. The sides
alternate, their order rotating from repeat to repeat; the figure is the median of the paired
ratios (2 workers / 1 worker).

On a 2-core machine the two workers' compute equals the one worker's two threads, so this
measures what gloo's all-reduce of the gradients (and of the loss at each step) costs a trial,
not a speedup: no target.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smallinit.core.trial_dir import TrialDir

from .base.common import (
    REPO,
    cache_dir,
    compose_trial,
    median,
    prepared_data,
    progress,
    rotate,
    spread,
)

CORES = 2
# (workers, threads per worker): the measured side, then the baseline.
SHAPES = {"measured": (2, 1), "baseline": (1, 2)}


def sweep_trial(overrides: tuple[str, ...], workers: int, threads: int, cache: Path) -> dict:
    """One `sweep.py -m` of the one trial, trained by `workers` workers of `threads` CPUs each."""
    cwd = Path(tempfile.mkdtemp(prefix="smallinit-bench-dp-"))
    name = f"dp{workers}x{threads}"
    args = ["-m", *overrides, f"ray.num_cpus={CORES}", f"ray.workers_per_trial={workers}",
            f"ray.cpus_per_trial={threads}", "train.parallel=ddp", "hydra.sweeper.max_concurrent=1",
            "hydra.sweeper.asha.enabled=false", "wandb.mode=disabled", f"name={name}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(cache), "WANDB_API_KEY": "",
           "WANDB_SILENT": "true"}
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(REPO / "sweep.py"), *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        dirs = [d for d in TrialDir.all_in_sweep(cwd / "sweeps" / name) if d.finished]
        if proc.returncode != 0 or len(dirs) != 1:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise RuntimeError(f"sweep of {workers} worker(s) x {threads} thread(s) exited {proc.returncode} "
                               f"with {len(dirs)} results:\n{tail}")
        r = dirs[0].read_result()
        return {"workers": workers, "threads": threads, "tokens_per_s": r["tokens_per_s"], "tokens": r["tokens"],
                "steps": r["steps"], "run_trial_wall_s": r["wall_s"], "sweep_wall_s": wall, "dtype": r["dtype"],
                "final_val_loss": r["final_val_loss"]}
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def run(settings) -> dict:
    name = "dp_scaling"
    cache = cache_dir()
    trial = compose_trial(*settings.dp_overrides)
    prepared_data(trial)  # tokenised once here, not inside the first timed sweep
    t = trial.train
    progress(name, f"{trial.preset}, {t.total_steps} steps x {t.tokens_per_step} tokens; 2 workers x 1 thread (ddp, "
                   f"gloo) against 1 worker x 2 threads, {settings.repeats} repeat(s), one sweep each")
    runs: dict[str, list[dict]] = {side: [] for side in SHAPES}
    for r in range(settings.repeats):
        for side in rotate(list(SHAPES), r):
            out = sweep_trial(settings.dp_overrides, *SHAPES[side], cache)
            runs[side].append(out)
            progress(name, f"repeat {r + 1}/{settings.repeats} {out['workers']} x {out['threads']}: "
                           f"{out['tokens_per_s']:8,.0f} tokens/s (sweep {out['sweep_wall_s']:.1f} s)")
    paired = [m["tokens_per_s"] / b["tokens_per_s"] for m, b in zip(runs["measured"], runs["baseline"])]

    def side(key: str) -> dict:
        rs = runs[key]
        return {"workers": SHAPES[key][0], "threads": SHAPES[key][1],
                "tokens_per_s": median(x["tokens_per_s"] for x in rs),
                "sweep_wall_s": median(x["sweep_wall_s"] for x in rs),
                "run_trial_wall_s": median(x["run_trial_wall_s"] for x in rs)}

    return {
        "ratio": median(paired),
        "target": None,
        "pass": None,
        "metric": "tokens/s of the trial's optimizer steps (rank 0's result.json) with ray.workers_per_trial=2 x "
                  "ray.cpus_per_trial=1 (ddp, gloo) / the same trial with 1 worker x 2 CPUs; each a `sweep.py -m` "
                  "of the one trial; median of paired repeats",
        "baseline": side("baseline"),
        "measured": side("measured"),
        "note": f"on {CORES} cores both sides have the same compute: the ratio is what gloo's all-reduce costs, not "
                "a speedup",
        "dtype": runs["baseline"][0]["dtype"],
        "steps": t.total_steps,
        "tokens_per_step": t.tokens_per_step,
        "trial_overrides": list(settings.dp_overrides),
        "paired_ratios": paired,
        "spread": spread(paired),
        "repeats": len(paired),
        "runs": runs,
    }
