"""Train loss against held-out loss in a per-budget crossover record: does the recipe's lead come
with a smaller gap between validation and training loss (what "overfits the repeated text less"
would need), or a larger one?

For each step named, in the whole runs at the largest budget's chosen lrs (confirm seeds), each
arm's train loss as the mean of its logged train/loss over the last `--window` steps up to that
step, its val loss as logged at that step, and, paired by seed, recipe − baseline of the train loss
and of val − train, with 95% t-intervals. The train loss is the loss of the batches trained on
(text the model may have seen before, past one pass over the corpus); the val loss is the record's
held-out tokens. A step before the run's cooldown reads the stable phase, the last step the end of
the cooldown.

    python -m records.train_val --crossover sweeps/crossover [--steps 4096,8192] \\
        [--window 128] [--out checks.md [--append]]

Every run it reads must have finished with its files as it wrote them (core/trial_files.py): an
unfinished or changed one stops the command in one line naming it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from smallinit.core.markdown import table as md_table
from smallinit.core.trial_dir import DamagedFile, TrialDir, unusable
from smallinit.experiments.stats.paired import t_interval

from . import OVERWRITE_HELP, sweep_protocol, write_record

TRAIN, VAL = "train/loss", "val/loss"


def whole_runs(sweep: Path, baseline: str = "baseline") -> tuple[dict, str, int]:
    """({(arm, seed): trial folder} of the confirm runs at the lr each arm chose for the largest
    budget (the runs that are whole there), the recipe arm's name, that budget in tokens)."""
    record = sweep_protocol(sweep)
    lr_of, budget = {}, 0
    for c in record.get("choices", []):
        picks = {int(x["budget_tokens"]): float(x["chosen"]["optim.lr"]) for x in c.get("chosen_by_budget") or []}
        if picks:
            budget = max(picks)
            lr_of[c["setting"]["arm"]] = picks[budget]
    if baseline not in lr_of or len(lr_of) != 2:
        raise SystemExit(f"error: {sweep}/protocol.json names arms {sorted(lr_of)}; it needs {baseline!r} and one other")
    recipe = next(a for a in lr_of if a != baseline)
    runs = {}
    for folder in TrialDir.all_in_sweep(sweep):
        p = folder.read_sweep_plan().get("params") or {}
        seed = p.get(record.get("seed_key", "seed"))
        if seed in record.get("confirm_seeds", []) and p.get("arm") in lr_of \
                and float(f"{float(p['optim.lr']):.6g}") == float(f"{lr_of[p['arm']]:.6g}"):
            # Only a finished trial whose files are the ones it wrote (core/trial_files.py) is read.
            which = f"{folder.path} ({p['arm']}, seed {seed})"
            if not folder.finished:
                raise SystemExit(f"error: {which} has not finished (no result.json): rerun its sweep, then read again")
            damage = folder.damaged_result()
            if damage is not None:
                raise SystemExit(f"error: {which} is {unusable(damage)}: rerun its sweep to train it again, then read again")
            runs[(p["arm"], int(seed))] = folder
    return runs, recipe, budget


def losses_at(folder: TrialDir, step: int, window: int) -> tuple[float, float]:
    """(mean train loss over the logged steps in (step − window, step], val loss logged at step)."""
    try:
        rows = folder.metrics_rows()
    except DamagedFile as e:
        raise SystemExit(f"error: {e}") from None
    train = [r[TRAIN] for r in rows if TRAIN in r and step - window < r["step"] <= step]
    val = [r[VAL] for r in rows if VAL in r and r["step"] == step]
    if not train or not val:
        raise SystemExit(f"error: {folder.path} logs no {TRAIN} before or no {VAL} at step {step}: name a step it evaluated")
    return float(np.mean(train)), float(val[-1])


def report(sweep: Path, steps: list[int], window: int, baseline: str = "baseline") -> str:
    runs, recipe, budget = whole_runs(Path(sweep), baseline)
    seeds = sorted(s for (arm, s) in runs if arm == recipe and (baseline, s) in runs)
    rows = []
    for step in steps:
        got = {(arm, s): losses_at(runs[(arm, s)], step, window) for arm in (baseline, recipe) for s in seeds}
        d_train = np.array([got[(recipe, s)][0] - got[(baseline, s)][0] for s in seeds])
        d_gap = np.array([(got[(recipe, s)][1] - got[(recipe, s)][0]) - (got[(baseline, s)][1] - got[(baseline, s)][0])
                          for s in seeds])
        mean = {arm: np.mean([got[(arm, s)][0] for s in seeds]) for arm in (baseline, recipe)}
        gap = {arm: np.mean([got[(arm, s)][1] - got[(arm, s)][0] for s in seeds]) for arm in (baseline, recipe)}
        (t, t_lo, t_hi), (g, g_lo, g_hi) = t_interval(d_train), t_interval(d_gap)
        rows.append([f"{step:,}", f"{mean[baseline]:.4f}", f"{mean[recipe]:.4f}", f"{t:+.4f} [{t_lo:+.4f}, {t_hi:+.4f}]",
                     f"{gap[baseline]:.4f}", f"{gap[recipe]:.4f}", f"{g:+.4f} [{g_lo:+.4f}, {g_hi:+.4f}]", str(len(seeds))])
    header = ["step", f"train, {baseline}", f"train, {recipe}", f"train: {recipe} − {baseline}", f"val − train, {baseline}",
              f"val − train, {recipe}", f"val − train: {recipe} − {baseline}", "seeds"]
    return (f"**Train loss against held-out loss** (`python -m records.train_val`): the whole "
            f"runs to {budget:,} tokens, each arm at the lr it chose there, confirm seeds paired; train loss the mean "
            f"of the logged train loss over the last {window} steps up to the step, val loss the held-out loss at that "
            "step; differences with their 95% t-intervals, nats/token. Less overfitting would show as a smaller "
            "val − train gap for the recipe.\n\n" + md_table(header, rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crossover", type=Path, required=True, help="the per-budget sweep folder")
    ap.add_argument("--steps", default="4096,8192", help="steps to read, comma-separated (each one evaluated)")
    ap.add_argument("--window", type=int, default=128, help="steps of train loss averaged up to each step")
    ap.add_argument("--baseline", default="baseline")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--append", action="store_true", help="add to --out after a blank line")
    ap.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    a = ap.parse_args(argv)
    if not (a.crossover / "protocol.json").is_file():
        print(f"error: --crossover={str(a.crossover)!r} is invalid: no protocol.json there", file=sys.stderr)
        return 2
    text = report(a.crossover, [int(s) for s in a.steps.split(",")], a.window, a.baseline)
    print(text, end="")
    if a.out:
        before = a.out.read_text().rstrip("\n") + "\n\n" if a.append and a.out.is_file() else ""
        write_record(a.out, before + text, "records.train_val", a.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
