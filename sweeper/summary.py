"""The closing summary of a sweep, read from its results table: how many trials are in each
state, and each distinct failure reason with the trials (and their logs) it hit. One reason
shared by twenty trials is one line to read, not twenty."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from core import results_schema as schema
from core.errors import first_line
from core.trial_dir import TrialDir

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
        params = " ".join(f"{c.removeprefix(schema.PARAM_PREFIX)}={row[c]}" for c in df.columns
                          if c.startswith(schema.PARAM_PREFIX))
        number = row[schema.TRIAL_NUMBER]
        label = f"trial {int(number)}" if pd.notna(number) else "trial"
        log = folder.log if folder.log.exists() else folder.failure_json
        groups.setdefault(reason, []).append(f"    {label} {params}  full log: {log}")
    lines = []
    for reason, trials in groups.items():
        lines.append(f"failed ({len(trials)} trial{'s' if len(trials) != 1 else ''}): {reason}")
        lines += trials
    return lines


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
