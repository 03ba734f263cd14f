"""trainer_vs_bare and probe_overhead: one trial through `run_trial` against the bare loop.

Three variants alternate within every repeat (their order rotates from repeat to repeat):
    bare      bench/base/bare.py: the same training and nothing else
    full      run_trial with the default train config: validation, probes, metrics.jsonl and a
              reporter, checkpoints, per-token losses, final weights, result.json
    no_probe  the same with train.probe_every=0

What the ratios divide. The trial's own tokens/s (TrialResult.tokens_per_s) times only the
optimizer steps, so it cannot see probes, checkpoints or setup. The headline therefore uses
the trial's wall time (run_trial called to returned) less the time spent in validation
passes (`LMTask.evaluate` and the end-of-trial per-token losses): validation is the
measurement the researcher asked for, its price is set by train.eval_every/eval_tokens, and a
bare script that validated would pay the same. Its share is reported beside the ratio, with
the step-time ratio and the end-to-end ratio, so no cost is hidden.

probe_overhead's headline is timed inside the probed runs (time in run_probes against the rest
of the same run); the no_probe runs give the paired-run estimate beside it (see _probe_overhead).
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
from pathlib import Path

import torch

from .base.bare import bare_loop
from .base.common import compose_trial, median, prepared_data, progress, rotate, spread, timed_calls

TRAINER_TARGET = {"op": ">=", "value": 0.97}
PROBE_TARGET = {"op": "<=", "value": 1.03}


class MemoryReporter:
    """Stands in for the sweeper's Tune/W&B reporters: receives every logged dict."""

    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def close(self):
        pass


def _targets():
    import smallinit.trainer.loop as loop
    import smallinit.trainer.observer as observer
    from smallinit.trainer.distributed import Single
    from smallinit.trainer.tasks import LMTask

    # The periodic checkpoints go through the one-process Single.save; model.pt at the end
    # through the loop's own save_checkpoint.
    return {"eval": (LMTask, "evaluate"), "per_token_eval": (LMTask, "per_token_losses"),
            "probes": (observer, "run_probes"), "checkpoints": (Single, "save"), "weights": (loop, "save_checkpoint")}


def trial_run(trial, root: Path) -> dict[str, float]:
    """One run_trial into a fresh folder, with where its wall time went."""
    from smallinit.trainer.loop import run_trial

    out = Path(tempfile.mkdtemp(dir=root))
    try:
        with timed_calls(_targets()) as parts:
            t0 = time.perf_counter()
            result = run_trial(trial, out, reporter=MemoryReporter(), log=lambda *_: None)
            wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    train_s = result.tokens / result.tokens_per_s
    eval_s = parts.get("eval", 0.0) + parts.get("per_token_eval", 0.0)
    probe_s, ckpt_s = parts.get("probes", 0.0), parts.get("checkpoints", 0.0) + parts.get("weights", 0.0)
    return {"wall_s": wall, "train_s": train_s, "eval_s": eval_s, "probe_s": probe_s, "ckpt_s": ckpt_s,
            "other_s": wall - train_s - eval_s - probe_s - ckpt_s, "instrument_s": wall - eval_s,
            "tokens": result.tokens, "final_val_loss": result.final_val_loss}


def run(settings, selected: set[str]) -> dict[str, dict]:
    name = "trainer"
    torch.set_num_threads(settings.threads)
    trial = compose_trial(*settings.trial_overrides, f"train.threads={settings.threads}")
    no_probe = dataclasses.replace(trial, train=dataclasses.replace(trial.train, probe_every=0))
    data = prepared_data(trial)
    t = trial.train
    progress(name, f"{trial.preset}, {t.total_steps} steps x {t.tokens_per_step} tokens, eval every {t.eval_every}, "
                   f"probes every {t.probe_every}, checkpoint every {t.ckpt_every}, {settings.threads} thread(s), "
                   f"{settings.repeats} repeat(s)")
    root = Path(tempfile.mkdtemp(prefix="smallinit-bench-"))
    try:
        # Warm-up (untimed): kernels, allocator, LAPACK for the probes' SVDs, first-call imports.
        warm = dataclasses.replace(trial, train=dataclasses.replace(trial.train, max_steps=2, max_tokens=None))
        bare_loop(trial, data, steps=2)
        trial_run(warm, root)
        variants = {"bare": lambda: bare_loop(trial, data), "full": lambda: trial_run(trial, root)}
        if "probe_overhead" in selected:
            variants["no_probe"] = lambda: trial_run(no_probe, root)
        runs: dict[str, list[dict]] = {k: [] for k in variants}
        for r in range(settings.repeats):
            for key in rotate(list(variants), r):
                gc.collect()
                out = variants[key]()
                runs[key].append(out)
                progress(name, f"repeat {r + 1}/{settings.repeats} {key:8s} wall {out['wall_s']:6.2f} s, "
                               f"{out['tokens'] / out['wall_s']:8,.0f} tokens/s end to end")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {}
    if "trainer_vs_bare" in selected:
        results["trainer_vs_bare"] = _trainer_vs_bare(runs, settings)
    if "probe_overhead" in selected:
        results["probe_overhead"] = _probe_overhead(runs, settings)
    return results


def _tok_s(run: dict, key: str) -> float:
    return run["tokens"] / run[key]


def _trainer_vs_bare(runs, settings) -> dict:
    bare, full = runs["bare"], runs["full"]
    paired = [_tok_s(f, "instrument_s") / _tok_s(b, "wall_s") for b, f in zip(bare, full)]
    ratio = median(paired)
    parts = {k: median(f[k] for f in full) for k in ("wall_s", "train_s", "eval_s", "probe_s", "ckpt_s", "other_s")}
    bare_wall, bare_steps = median(b["wall_s"] for b in bare), median(b["steps_s"] for b in bare)
    return {
        "ratio": ratio,
        "target": TRAINER_TARGET,
        "pass": ratio >= TRAINER_TARGET["value"],
        "metric": "tokens/s of run_trial over its wall time less validation passes, / tokens/s of the bare loop "
                  "(model build to last step); median of paired repeats",
        "baseline": {"tokens_per_s": median(_tok_s(b, "wall_s") for b in bare), "wall_s": bare_wall,
                     "steps_s": bare_steps},
        "measured": {"tokens_per_s": median(_tok_s(f, "instrument_s") for f in full),
                     "tokens_per_s_steps_only": median(_tok_s(f, "train_s") for f in full), **parts},
        "ratio_steps": median(_tok_s(f, "train_s") / _tok_s(b, "steps_s") for b, f in zip(bare, full)),
        "ratio_end_to_end": median(_tok_s(f, "wall_s") / _tok_s(b, "wall_s") for b, f in zip(bare, full)),
        "eval_share": parts["eval_s"] / parts["wall_s"],
        # Where the trial's extra time goes, as fractions of the bare loop's wall time.
        "overhead_vs_bare": {
            "steps": (parts["train_s"] - bare_steps) / bare_wall,
            "probes": parts["probe_s"] / bare_wall,
            "checkpoints_and_weights": parts["ckpt_s"] / bare_wall,
            "setup_reporting_outputs": (parts["other_s"] - (bare_wall - bare_steps)) / bare_wall,
        },
        # In-run cross-check: the share of the trial's non-validation time spent in optimizer
        # steps (what probes, checkpoints, setup and outputs leave for training), free of the
        # load drift between paired runs but blind to per-step overhead (see ratio_steps).
        "ratio_direct": median(f["train_s"] / f["instrument_s"] for f in full),
        "paired_ratios": paired,
        "spread": spread(paired),
        "repeats": len(paired),
        "threads": settings.threads,
        "runs": {"bare": bare, "full": full},
    }


def _probe_overhead(runs, settings) -> dict:
    """The headline is timed inside each probed run: the time spent in run_probes against the
    rest of the same run's training time. Differencing two ~50 s runs for a ~2% effect does
    not resolve it on a shared machine (paired ratios scattered from 0.95 to 1.13 in our runs);
    that estimate is still reported, as ratio_paired_runs."""
    full, no_probe = runs["full"], runs["no_probe"]
    direct = [f["instrument_s"] / (f["instrument_s"] - f["probe_s"]) for f in full]
    paired = [f["instrument_s"] / n["instrument_s"] for f, n in zip(full, no_probe)]
    ratio = median(direct)
    return {
        "ratio": ratio,
        "target": PROBE_TARGET,
        "pass": ratio <= PROBE_TARGET["value"],
        "metric": "training time (run_trial wall less validation) with probes at the default cadence / the same "
                  "less the time spent in run_probes; median over repeats",
        "baseline": {"training_s": median(f["instrument_s"] - f["probe_s"] for f in full),
                     "training_s_no_probe_runs": median(n["instrument_s"] for n in no_probe)},
        "measured": {"training_s": median(f["instrument_s"] for f in full), "probe_s": median(f["probe_s"] for f in full)},
        "ratio_paired_runs": median(paired),
        "paired_ratios": paired,
        "direct_ratios": direct,
        "spread": spread(direct),
        "repeats": len(direct),
        "threads": settings.threads,
        "runs": {"no_probe": no_probe},
    }
