"""The closing summary of a sweep, read from its results table: how many trials are in each
state, and each distinct failure reason with the trials (and their logs) it hit. One reason
shared by twenty trials is one line to read, not twenty. And W&B's two lines: where the runs go,
as the first trials start, and at the end the command that uploads the offline ones."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from smallinit.core import results_schema as schema
from smallinit.core.errors import first_line
from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.config.schema import WandbConf

_ORDER = (schema.COMPLETE, schema.PRUNED, schema.FAIL, schema.INTERRUPTED)


def state_counts(df: pd.DataFrame) -> str:
    """'3 complete, 1 fail, 2 interrupted', in a fixed order; 'no trials' for an empty table."""
    counts = df[schema.STATE].value_counts().to_dict() if not df.empty else {}
    order = [s for s in _ORDER if s in counts] + sorted(s for s in counts if s not in _ORDER)
    return ", ".join(f"{counts[s]} {s.lower()}" for s in order) or "no trials"


def failure_lines(df: pd.DataFrame, sweep_dir: Path) -> list[str]:
    """One `failed (N trials): <reason>` line per distinct first line of fail_reason, then one
    indented line per trial it hit: its number, swept values and the log to read."""
    if df.empty:
        return []
    failed = df[df[schema.STATE] == schema.FAIL]
    groups: dict[str, list[str]] = {}
    for _, row in failed.iterrows():
        reason = first_line(row[schema.FAIL_REASON] or "") or "no reason recorded"
        folder = TrialDir(schema.to_local_path(row["trial_dir"], sweep_dir) or "")
        params = " ".join(f"{k}={row[c]}" for k in schema.swept_keys(df) if (c := schema.config_column(k)) in df)
        number = row[schema.TRIAL_NUMBER]
        label = f"trial {int(number)}" if pd.notna(number) else "trial"
        log = folder.log if folder.log.exists() else folder.failure_json
        groups.setdefault(reason, []).append(f"    {label} {params}  full log: {log}")
    lines = []
    for reason, trials in groups.items():
        lines.append(f"failed ({len(trials)} trial{'s' if len(trials) != 1 else ''}): {reason}")
        lines += trials
    return lines


def best_setting_line(done: pd.DataFrame) -> str | None:
    """With seeds swept (a param named seed or ending in .seed), the setting with the lowest
    mean loss over its seeds (the trial the driver calls best is one seed's luck, and the report
    ranks settings by their seed means), and how far it is ahead of the next setting: the mean
    of their differences paired by seed with its 95% t-interval, as the report's first sentence
    gives it. Under hydra.sweeper.protocol only confirm seeds count (the tune seeds chose the lrs).
    None without two or more seeds per setting."""
    params = [c for k in schema.swept_keys(done) if (c := schema.config_column(k)) in done]
    seeds = [c for c in params if c.removeprefix(schema.CONFIG_PREFIX).split(".")[-1] == "seed"]
    # train.stop_after: where a confirm run ends (protocol.confirm_to_chosen), not a setting.
    setting = [c for c in params if c not in seeds and c != schema.config_column("train.stop_after")]
    if not seeds or not setting or done.empty:
        return None
    budgets = done[schema.BUDGET_TOKENS] if schema.BUDGET_TOKENS in done else None
    if budgets is not None and budgets.nunique() > 1:  # a row per budget: rank at the largest
        done = done[budgets == budgets.max()]
    if schema.ROLE in done and (done[schema.ROLE] == "confirm").any():
        done = done[done[schema.ROLE] == "confirm"]
    groups = done.groupby(setting, dropna=False)[schema.FINAL_VAL_LOSS].agg(["mean", "count"])
    groups = groups[groups["count"] >= 2].sort_values("mean")
    if groups.empty:
        return None

    def named(key) -> str:
        values = key if isinstance(key, tuple) else (key,)
        def value(v) -> str:
            if pd.isna(v):
                return "(not swept)"
            return f"{v:g}" if isinstance(v, float) else str(v)

        return " ".join(f"{c.removeprefix(schema.CONFIG_PREFIX)}={value(v)}" for c, v in zip(setting, values))

    best = groups.index[0]
    line = f"best setting: {named(best)}, val loss {groups['mean'].iloc[0]:.4f} (mean of {int(groups['count'].iloc[0])} seeds)"
    if len(groups) > 1:
        def seed_losses(key) -> pd.Series:
            values = key if isinstance(key, tuple) else (key,)
            mine = np.ones(len(done), bool)
            for c, v in zip(setting, values):  # a setting's empty cell (a key it did not sweep) matches empty
                mine &= (done[c].isna() if pd.isna(v) else done[c] == v).to_numpy()
            return done[mine].set_index(seeds)[schema.FINAL_VAL_LOSS]

        diff = (seed_losses(groups.index[1]) - seed_losses(best)).dropna()
        if len(diff) >= 2:
            mean, sem = float(diff.mean()), float(diff.std(ddof=1)) / len(diff) ** 0.5
            half = float(stats.t.ppf(0.975, len(diff) - 1)) * sem
            held = "holds 0: not separated" if mean - half <= 0 <= mean + half else "excludes 0"
            line += (f", ahead of {named(groups.index[1])} by {mean:.4f} nats (95% interval {mean - half:.4f} to "
                     f"{mean + half:.4f}, paired over {len(diff)} seeds; it {held})")
    return line + "; the report gives the verdict"


def failed_run_message(failed: int, ended: int, results: Path) -> str:
    """The last line when trials of this run failed (the exit status is then 1)."""
    return (f"{failed} of {ended} trials of this run failed (reasons above, under 'failed'; "
            f"table: {results})")


def all_failed_before(df: pd.DataFrame) -> bool:
    """Every trial in the table failed, none of them in this run (that is failed_run_message)."""
    return not df.empty and bool((df[schema.STATE] == schema.FAIL).all())


def failed_before_message(n: int, results: Path) -> str:
    """The last line of a rerun in which every trial stays failed (the exit status is then 1)."""
    trials = "the one trial of this sweep" if n == 1 else f"all {n} trials of this sweep"
    return (f"{trials} failed in an earlier run and {'was' if n == 1 else 'were'} not run again (reasons above, "
            f"under 'failed'); hydra.sweeper.retry_failed=true trains them again (table: {results})")


# wandb.init(dir=<trial folder>) (trainable.WandbReporter) keeps each run's files there, under
# wandb/offline-run-<time>-<run id> when offline: one such folder per attempt of the trial.
OFFLINE_RUNS = "trials/*/wandb/offline-run-*"


def wandb_line(wandb_cfg: dict[str, Any], sweep_dir: Path, group: str) -> str:
    """One line as the first trials start: the mode the runs will have (auto resolved as the
    workers resolve it, from this machine's key), where they appear and where their files go."""
    from smallinit.sweeper.worker.trainable import wandb_mode

    requested = wandb_cfg.get("mode", WandbConf.mode)
    mode = wandb_mode(requested)
    why = f"wandb.mode={requested}"
    if requested == "auto":
        why += ": a W&B key is set" if mode == "online" else ": no WANDB_API_KEY or `wandb login`"
    trials = sweep_dir / "trials" / "<identity>"
    if mode == "disabled":
        return f"W&B: disabled ({why}); each trial's metrics are in {trials / 'metrics.jsonl'}"
    project = "/".join(str(p) for p in (wandb_cfg.get("entity"), wandb_cfg.get("project", WandbConf.project)) if p)
    then = ", to upload with `wandb sync` (the command is printed at the end)" if mode == "offline" else ""
    return f"W&B: {mode} ({why}), project {project}, group {group}, run files in {trials / 'wandb'}{then}"


def wandb_sync_line(sweep_dir: Path) -> str | None:
    """The command that uploads the sweep's offline runs not uploaded yet (`wandb sync` leaves a
    run-<id>.wandb.synced beside what it uploaded and skips those); None when there are none.
    The glob stays unquoted for the shell to expand; the folder is quoted."""
    runs = [d for d in sweep_dir.glob(OFFLINE_RUNS) if d.is_dir() and not any(d.glob("*.wandb.synced"))]
    if not runs:
        return None
    count = f"{len(runs)} offline run{'s' if len(runs) != 1 else ''}"
    return f"W&B: {count} not uploaded yet; upload with: wandb sync {shlex.quote(str(sweep_dir))}/{OFFLINE_RUNS}"
