"""The trial folders are the source of truth; the study is an index over them.

A trial folder that finished (result.json) or failed (failure.json) but that the study does
not know (optuna.db deleted, or replaced by a fresh one) is recorded again, as it ended: its
params, value, validation curve, identity and failure reason and kind. The rerun then skips
it as it would have with the old study, rather than training it twice or failing on a table
without trial numbers. A folder with neither file is left to the plan: it is resumed.

A study trial still RUNNING whose folder ended is closed as the folder says: the driver was
killed after the worker wrote result.json (or failure.json) and before it told the study.

The other way round (reconcile, run first): a result.json that cannot be reported (unreadable,
cut off, another schema, no finite loss, another trial's copied in) is set aside, and an ended
study trial whose folder is gone, or that says COMPLETE while its folder holds no result.json,
is superseded. Each is named in one line and the trial trains again: a result that cannot be
read cannot be reported, and skipping it would drop the trial from results.parquet without a
word. So is a finished trial's budgets/<tokens>.json (train.budgets) that is missing or not its
own: the largest budget's is rewritten from result.json (they hold the same result); another's
branch forked from a stable state that is gone, so the trial trains again.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from smallinit.core.errors import shown
from smallinit.core.trial_dir import TRIALS_FOLDER, DamagedFile, TrialDir, unusable

from .study import TRIAL_DIR, Study


def reconcile(study: Study, sweep_dir: Path) -> list[str]:
    """Make the folders and the study agree before a plan reads them; one line per difference.
    Only trials whose folders belong in sweep_dir are judged: a shared study's others are not ours."""
    lines, set_aside = [], {}
    for d in TrialDir.all_in_sweep(sweep_dir):
        lines += _heal_trial_json(d)
        why = d.damaged_result()
        if why is not None:
            aside = d.set_aside_result()
            set_aside[d.identity] = f"{d.result_json.name} was {unusable(why)}"
            lines.append(f"{shown(d.result_json)} is {unusable(why)}: set aside as {aside.name}; "
                         "the trial trains again")
        elif d.finished:
            lines += _heal_budgets(d)
            if not d.finished:
                set_aside[d.identity] = "a budget's result was missing or not its own"
    trials = Path(sweep_dir).resolve() / TRIALS_FOLDER
    for ident, t in study.by_identity().items():
        folder = t.user_attrs.get(TRIAL_DIR)
        if t.state == TrialState.RUNNING or folder is None or Path(folder).resolve().parent != trials:
            continue
        d = TrialDir(folder)
        if ident in set_aside:  # named above
            why = set_aside[ident]
        elif not d.path.is_dir():
            why = f"its folder {shown(d.path)} is gone"
        elif t.state == TrialState.COMPLETE and not d.finished:
            why = f"{shown(d.result_json)} is missing"
        else:
            continue
        study.supersede(t, why)
        if ident not in set_aside:
            lines.append(f"trial {t.number} ({t.state.name.lower()}) is not in its folder: {why}; "
                         "the trial trains again")
    return lines


def _heal_trial_json(d: TrialDir) -> list[str]:
    """A finished trial's trial.json that changed, where it is the only changed file, is rewritten
    from sweep.json (the driver's record of the same identity, config and worker count) when that
    gives back the very bytes the trial wrote; otherwise the trial is left to damaged_result."""
    changed = d.changed_files()
    if set(changed) != {d.trial_json.name}:
        return []
    plan = d.read_sweep_plan()
    if not plan or plan.get("identity") != d.identity:
        return []
    aside = d.set_aside_file(d.trial_json) if d.trial_json.exists() else None  # kept, never written over
    d.write_trial(plan["identity"], plan["config"], plan.get("workers", 1))
    if d.changed_files():  # not the very bytes: as it was, and the trial trains again
        d.trial_json.unlink()
        if aside is not None:
            aside.rename(d.trial_json)
        return []
    kept = f"set aside as {aside.name} and " if aside is not None else ""
    return [f"{shown(d.trial_json)} was {changed[d.trial_json.name]}: {kept}rewritten from sweep.json, which holds the "
            "same record"]


def _heal_budgets(d: TrialDir) -> list[str]:
    """One line per budgets/<tokens>.json of finished trial d that is missing, damaged or not
    its own. The largest budget's is rewritten from result.json (the same result); any other
    sets result.json aside too, so the trial trains again and runs that branch."""
    budgets, lines = d.planned_budgets(), []
    result = d.read_result() if budgets else None  # whole and its own: reconcile checked it first
    for tokens in budgets:
        path = d.budget_json(tokens)
        why = d.damaged_budget(tokens)
        if why is None and path.exists():
            continue
        what = f"{shown(path)} is {'missing' if why is None else unusable(why)}"
        if why is not None:
            what += f": set aside as {d.set_aside_budget(tokens).name}"
        if tokens == max(budgets) and result.get("budget_tokens") in (None, tokens):
            d.write_budget_result(tokens, result)
            lines.append(f"{what}; rewritten from result.json, which holds the same (largest) budget's result")
        elif d.finished:
            lines.append(f"{what}; result.json set aside as {d.set_aside_result().name}: the trial trains again "
                         "to run that budget's branch")
        else:  # result.json already set aside for an earlier budget: the retrain runs this one too
            lines.append(f"{what}; its branch runs when the trial trains again")
    return lines


def restore_from_folders(study: Study, sweep_dir: Path, distributions: dict[str, BaseDistribution]) -> tuple[int, int]:
    """Record in the study every ended trial folder of sweep_dir it lacks, and close every
    trial it holds RUNNING whose folder ended; (how many recorded, how many closed)."""
    gone = study.superseded()
    trials = [t for t in study.study.get_trials(deepcopy=False) if t.number not in gone]
    known = {t.user_attrs.get("identity") for t in trials}
    folders = [d for d in TrialDir.all_in_sweep(sweep_dir) if d.finished or d.failed]
    ended = [d for d in folders if d.identity not in known and d.read_sweep_plan().get("params") is not None]
    ended.sort(key=lambda d: (d.sweep_json.stat().st_mtime, d.identity))  # roughly the order they were planned
    by_identity = {d.identity: d for d in folders}
    closed = 0
    for t in trials:
        d = by_identity.get(t.user_attrs.get("identity"))
        if t.state == TrialState.RUNNING and d is not None:
            state, value, attrs = _outcome(d)
            study.set_attrs(t, **attrs)
            study.finish(t, state, value)
            closed += 1
    if not ended:
        return 0, closed
    plans = {d.identity: d.read_sweep_plan()["params"] for d in ended}
    dists = _covering(distributions, list(plans.values()))
    for d in ended:
        params = plans[d.identity]
        state, value, attrs = _outcome(d)
        attrs = {"identity": d.identity, TRIAL_DIR: study.stored_path(d.path), "restored_from_folder": True, **attrs}
        study.study.add_trial(optuna.trial.create_trial(
            state=state, value=value, params=params, distributions={k: dists[k] for k in params},
            user_attrs=attrs, intermediate_values=_val_curve(d)))
    return len(ended), closed


def _outcome(d: TrialDir) -> tuple[TrialState, float | None, dict[str, Any]]:
    """(state, value, failure attrs) of an ended trial folder, as the study records them."""
    result, failure = d.read_result(damaged_ok=True), d.read_failure(damaged_ok=True)
    damage = d.damaged_result()
    if result is not None and damage is None:
        return TrialState.COMPLETE, result["final_val_loss"], {}
    if d.finished:  # reconcile sets such a file aside first; this is for a direct call
        why = f"{d.result_json.name} is {unusable(damage)}: the next run of the sweep sets it aside and trains it again"
    else:
        why = (failure or {}).get("reason") or "no finite validation loss"
    attrs = {"fail_reason": why}
    if (failure or {}).get("kind"):
        attrs["fail_kind"] = failure["kind"]
    return TrialState.FAIL, None, attrs


def _val_curve(d: TrialDir) -> dict[int, float]:
    """step -> val/loss, as the trial reported it to the study while it ran."""
    try:
        rows = d.metrics_rows()  # a last line a kill cut short is left out
    except DamagedFile:  # the curve only informs a pruner; the trial's outcome is its result.json
        return {}
    return {row["step"]: float(row["val/loss"]) for row in rows
            if isinstance(row.get("val/loss"), int | float) and math.isfinite(row["val/loss"])}


def _covering(base: dict[str, BaseDistribution], points: list[dict[str, Any]]) -> dict[str, BaseDistribution]:
    """The sweep's distributions, widened to hold every restored value (an earlier, wider grid)."""
    out = dict(base)
    for key in {k for p in points for k in p}:
        values = [p[key] for p in points if key in p]
        dist = out.get(key)
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if isinstance(dist, IntDistribution) and all(isinstance(v, int) for v in values):
            out[key] = IntDistribution(min(dist.low, *values), max(dist.high, *values), log=dist.log)
        elif isinstance(dist, FloatDistribution | IntDistribution) and numeric:
            out[key] = FloatDistribution(float(min(dist.low, *values)), float(max(dist.high, *values)), log=dist.log)
        elif dist is None and numeric:
            out[key] = FloatDistribution(float(min(values)), float(max(values)))
        else:
            choices = list(dist.choices) if isinstance(dist, CategoricalDistribution) else []
            out[key] = CategoricalDistribution(choices + [v for v in dict.fromkeys(values) if v not in choices])
    return out
