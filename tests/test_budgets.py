"""Several token budgets from one run (train.budgets): the config's rules, each branch's lr
schedule, each branch's loss against a run trained for that budget alone, the budget files and
a resume that trains no finished branch again, and the results table's rows per budget."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from smallinit.core import results_schema as schema
from smallinit.core.trial_dir import TrialDir
from smallinit.model import ConfigError
from smallinit.trainer.config import OptimConfig
from smallinit.trainer.loop import run_trial
from smallinit.trainer.schedule import Branch, branch_lr_at, budget_branches, lr_at

from .conftest import REPO, TINY, StopAt, sweep

# TINY trains 128 tokens a step: budgets of 10, 20 and 22 steps, cooldowns of 2, 4 and 4 steps,
# forks at steps 8, 16 and 18. The last budget forks (18) before the middle one ends (20).
BUDGETS = ["optim.schedule=wsd", "train.budgets=[1280,2560,2816]"]
# No warmup: then a branch's schedule is exactly that of a run with that budget alone.
NO_WARMUP = "optim.warmup_frac=0"


def _quiet(lines: list[str]):
    return lambda *a: lines.append(" ".join(str(x) for x in a))


def _budget(d: TrialDir, tokens: int) -> dict:
    return json.loads(d.budget_json(tokens).read_text())


def test_budgets_replace_max_tokens_and_bad_values_are_one_line_errors(trial_config):
    trial = trial_config(*BUDGETS, "train.max_tokens=1024")
    assert trial.train.budgets == (1280, 2560, 2816) and trial.train.max_tokens == 2816
    assert trial.train.total_steps == 22
    assert trial.identity() == trial_config(*BUDGETS, "train.max_tokens=2048").identity()  # max_tokens is replaced
    assert trial.identity() != trial_config(*BUDGETS, "train.cooldown_frac=0.25").identity()
    # Without budgets cooldown_frac means nothing, and trials keep the identity they had before budgets existed.
    assert trial_config().identity() == trial_config("train.cooldown_frac=0.5").identity()
    bad = {
        ("train.budgets=[2560,1280]", "optim.schedule=wsd"): "train.budgets=[2560, 1280] is invalid: must be strictly increasing",
        ("train.budgets=[1000,2560]", "optim.schedule=wsd"): "train.budgets=[1000, 2560] is invalid: each must be a multiple",
        ("train.budgets=[0,2560]", "optim.schedule=wsd"): "train.budgets=[0, 2560] is invalid: a non-empty list",
        ("train.budgets=[1280,2560]",): "optim.schedule='cosine' is invalid: must be wsd with train.budgets",
        (*BUDGETS, "train.max_steps=30"): "train.max_steps=30 is invalid: must be null with train.budgets",
        (*BUDGETS, "train.cooldown_frac=1.0"): "train.cooldown_frac=1.0 is invalid: must be a number in (0, 1)",
        (*BUDGETS, "train.cooldown_frac=0.05"): "train.cooldown_frac=0.05 is invalid: must give the smallest budget",
        # warmup: int(0.5 * 22) = 11 steps, past the smallest budget's fork at step 8
        (*BUDGETS, "optim.warmup_frac=0.5"): "optim.warmup_frac=0.5 is invalid: must end the warmup (11 steps",
    }
    for overrides, message in bad.items():
        with pytest.raises(ConfigError) as e:
            trial_config(*overrides)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_branches_fork_at_one_minus_cooldown_frac_in_fork_order():
    branches = budget_branches((1280, 2560, 2816), 128, 0.2)
    assert branches == [Branch(1280, 10, 8), Branch(2560, 20, 16), Branch(2816, 22, 18)]
    assert [b.cooldown for b in branches] == [2, 4, 4]


def test_a_branch_is_stable_then_decays_over_its_last_cooldown_steps():
    optim = OptimConfig(lr=1.0, min_lr_ratio=0.1, schedule="wsd")
    branch = Branch(2560, 20, 16)
    lrs = [branch_lr_at(s, branch, 2, optim) for s in range(20)]
    assert lrs[:2] == [0.5, 1.0]  # the shared warmup
    assert lrs[2:17] == [1.0] * 15  # stable through the fork step
    assert lrs[16:] == pytest.approx([1.0, 0.775, 0.55, 0.325])  # linear toward the floor 0.1, a step per 0.225
    # Every branch runs the same stable phase: before the earliest fork all agree.
    others = [Branch(1280, 10, 8), Branch(2816, 22, 18)]
    assert all(branch_lr_at(s, b, 2, optim) == lrs[s] for b in others for s in range(8))
    # One budget alone is the existing WSD schedule with decay_frac = cooldown_frac.
    wsd = OptimConfig(lr=1.0, min_lr_ratio=0.1, schedule="wsd", warmup_frac=0.05, decay_frac=0.2)
    alone = Branch(12800, 100, 80)
    assert [branch_lr_at(s, alone, 5, wsd) for s in range(100)] == [lr_at(s, 100, wsd) for s in range(100)]


def test_each_branch_equals_a_run_trained_for_its_budget_alone(trial_config, tmp_path):
    """The middle budget's branch and the main run both pass side trips: the state each restores
    must be the stable state exactly, or their losses would drift from the runs alone."""
    lines: list[str] = []
    trial = trial_config(*BUDGETS, NO_WARMUP, "train.log_every=1")
    result = run_trial(trial, tmp_path / "all", log=_quiet(lines))
    d = TrialDir(tmp_path / "all")
    branches = {b: _budget(d, b) for b in (1280, 2560, 2816)}
    assert [(r["budget_tokens"], r["steps"], r["tokens"]) for r in branches.values()] == [
        (1280, 10, 1280), (2560, 20, 2560), (2816, 22, 2816)]
    assert result.budget_tokens == 2816 and result.final_val_loss == branches[2816]["final_val_loss"]
    assert d.read_result() == branches[2816]
    assert [line.split(" tokens")[0] for line in lines if line.startswith("budget ")] == ["budget 1,280", "budget 2,560"]
    for tokens, branch in branches.items():
        alone = run_trial(trial_config("optim.schedule=wsd", f"train.budgets=[{tokens}]", NO_WARMUP),
                          tmp_path / str(tokens), log=lambda *_: None)
        assert branch["final_val_loss"] == pytest.approx(alone.final_val_loss, rel=1e-6), tokens
        assert branch["best_val_loss"] <= branch["final_val_loss"]
        assert branch["final_metrics"]["train/lr"] == pytest.approx(3e-3 * (1 - 0.9 * (alone.steps - 1 - (
            alone.steps - int(0.2 * alone.steps))) / int(0.2 * alone.steps)))
    # metrics.jsonl is the main run's alone: each step once, its lr the largest budget's schedule.
    rows = [json.loads(line) for line in d.metrics.read_text().splitlines()]
    logged = [(r["step"], r["train/lr"]) for r in rows if "train/lr" in r]
    assert [s for s, _ in logged] == list(range(1, 23))
    main = Branch(2816, 22, 18)
    assert [lr for _, lr in logged] == pytest.approx([branch_lr_at(s - 1, main, 0, trial.optim) for s, _ in logged])


def test_a_run_stopped_after_a_budget_trains_the_whole_plans_branches_and_no_more(trial_config, tmp_path):
    """train.stop_after: the warmup stays the whole plan's, so each budget it trains is the branch
    the whole run takes, step for step; a select-then-confirm sweep runs a value chosen only for
    the smaller budgets this way (hydra.sweeper.protocol.confirm_to_chosen)."""
    warm = "optim.warmup_frac=0.1"  # int(0.1 * 22) = 2 steps of the plan's 22; of 20 steps it would be 2 too, of 10 only 1
    whole, stopped = trial_config(*BUDGETS, warm), trial_config(*BUDGETS, warm, "train.stop_after=2560")
    assert (stopped.train.max_tokens, stopped.train.total_steps, stopped.train.budgets_trained) == (2560, 20, (1280, 2560))
    assert whole.train.budgets_trained == (1280, 2560, 2816) and stopped.identity() != whole.identity()
    assert trial_config(*BUDGETS, warm, "train.stop_after=2816").identity() == whole.identity()  # the whole plan
    for overrides, message in {(*BUDGETS, "train.stop_after=2000"): "train.stop_after=2000 is invalid: null or one of "
                               "train.budgets [1280, 2560, 2816]",
                               ("train.stop_after=1280",): "train.stop_after=1280 is invalid: must be null without "
                               "train.budgets"}.items():
        with pytest.raises(ConfigError, match=r"^" + re.escape(message)):
            trial_config(*overrides)
    run_trial(whole, tmp_path / "whole", log=lambda *_: None)
    lines: list[str] = []
    result = run_trial(stopped, tmp_path / "stopped", log=_quiet(lines))
    w, s = TrialDir(tmp_path / "whole"), TrialDir(tmp_path / "stopped")
    assert (result.budget_tokens, result.steps) == (2560, 20) and s.read_result() == _budget(s, 2560)
    assert not s.budget_json(2816).exists() and s.planned_budgets() == [1280, 2560]
    for tokens in (1280, 2560):  # bit for bit, on one machine
        assert _budget(s, tokens)["final_val_loss"] == _budget(w, tokens)["final_val_loss"]
    logged = [json.loads(line) for line in s.metrics.read_text().splitlines()]
    assert max(r["step"] for r in logged) == 20

    from smallinit.sweeper.results.results import build_table
    sweep_dir = tmp_path / "sweep"
    run_trial(stopped, TrialDir.in_sweep(sweep_dir, stopped.identity()).path, log=lambda *_: None)
    df = build_table(sweep_dir, {stopped.identity(): {"number": 0, "state": "COMPLETE"}})
    assert list(df[schema.BUDGET_TOKENS]) == [1280, 2560] and list(df[schema.STATE]) == ["COMPLETE"] * 2


def test_a_kill_inside_a_branch_resumes_at_its_fork(trial_config, tmp_path, monkeypatch):
    trial = trial_config(*BUDGETS)
    straight = run_trial(trial, tmp_path / "straight", log=lambda *_: None)
    real = TrialDir.write_budget_result

    def killed(self, tokens, result):  # dies as the first branch ends, before its file is written
        raise KeyboardInterrupt

    monkeypatch.setattr(TrialDir, "write_budget_result", killed)
    with pytest.raises(KeyboardInterrupt):
        run_trial(trial, tmp_path / "killed", log=lambda *_: None)
    monkeypatch.setattr(TrialDir, "write_budget_result", real)
    d = TrialDir(tmp_path / "killed")
    assert not d.budgets.exists() and torch_step(d) == 8  # the checkpoint is the stable state at the fork
    lines: list[str] = []
    resumed = run_trial(trial, d.path, log=_quiet(lines))
    assert any(line.startswith("resuming") and "from step 8/22" in line for line in lines)
    assert resumed.final_val_loss == pytest.approx(straight.final_val_loss, rel=1e-6)
    for tokens in (1280, 2560, 2816):
        assert _budget(d, tokens)["final_val_loss"] == pytest.approx(
            _budget(TrialDir(tmp_path / "straight"), tokens)["final_val_loss"], rel=1e-6)


def torch_step(d: TrialDir) -> int:
    import torch

    return torch.load(d.checkpoint, weights_only=False)["step"]


@pytest.mark.slow
def test_kill_9_after_a_branch_resumes_without_training_it_again(trial_config, data_cache, tmp_path):
    """The trainer CLI in a subprocess, killed with SIGKILL once the first budget's file is
    there; the resumed run trains the other budgets only and ends where a straight run does.
    (About 100 s on 2 shared cores: a CLI start, a kill, a resume and a straight run.)"""
    overrides = ["optim.schedule=wsd", "train.budgets=[1280,6400]"]  # forks at steps 8 and 40, 50 steps
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache)}
    proc = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), *TINY, *overrides, "hydra.run.dir=run"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    d = TrialDir(tmp_path / "run")
    deadline = time.monotonic() + 300
    while not d.budget_json(1280).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    err = proc.communicate()[1]
    assert d.budget_json(1280).exists(), err[-2000:]
    assert not d.result_json.exists()  # killed mid-run, as intended
    first = d.budget_json(1280).read_bytes()
    before = d.budget_json(1280).stat().st_mtime_ns

    trial = trial_config(*overrides)
    lines: list[str] = []
    resumed = run_trial(trial, d.path, log=_quiet(lines))
    assert any(line.startswith("resuming") for line in lines), lines
    assert not any(line.startswith("budget 1,280") for line in lines)
    assert d.budget_json(1280).read_bytes() == first and d.budget_json(1280).stat().st_mtime_ns == before
    straight = run_trial(trial, tmp_path / "straight", log=lambda *_: None)
    assert resumed.final_val_loss == pytest.approx(straight.final_val_loss, rel=1e-6)
    assert _budget(d, 1280)["final_val_loss"] == pytest.approx(
        _budget(TrialDir(tmp_path / "straight"), 1280)["final_val_loss"], rel=1e-6)


def test_the_results_table_has_a_row_per_budget(trial_config, tmp_path):
    from smallinit.experiments.data.load import load
    from smallinit.sweeper.results.results import build_table, write_table

    done = trial_config(*BUDGETS)
    half = trial_config(*BUDGETS, "train.seed=1")
    plain = trial_config("train.seed=2")
    run_trial(done, TrialDir.in_sweep(tmp_path, done.identity()).path, log=lambda *_: None)
    with pytest.raises(KeyboardInterrupt):  # half done: the first budget recorded, stopped at step 12
        run_trial(half, TrialDir.in_sweep(tmp_path, half.identity()).path, reporter=StopAt(12), log=lambda *_: None)
    plain_dir = TrialDir.in_sweep(tmp_path, plain.identity())
    plain_dir.write_sweep_plan({}, [], plain.identity(), plain.to_dict())  # planned, never started
    states = {done.identity(): {"number": 0, "state": "COMPLETE"}, half.identity(): {"number": 1, "state": "RUNNING"},
              plain.identity(): {"number": 2, "state": "RUNNING"}}
    df = build_table(tmp_path, states)
    rows = {r[schema.IDENTITY]: r for r in df.to_dict("records")}
    ident = done.identity()
    assert list(df[schema.IDENTITY]) == [f"{ident}@1280", f"{ident}@2560", f"{ident}@2816", f"{half.identity()}@1280",
                                         f"{half.identity()}@2560", f"{half.identity()}@2816", plain.identity()]
    assert list(df[schema.TRIAL_IDENTITY]) == [ident] * 3 + [half.identity()] * 3 + [plain.identity()]
    assert list(df[schema.BUDGET_TOKENS]) == [1280, 2560, 2816, 1280, 2560, 2816, 1024]
    assert list(df[schema.STATE]) == ["COMPLETE"] * 4 + ["INTERRUPTED"] * 3
    d = TrialDir.in_sweep(tmp_path, ident)
    for tokens in (1280, 2560, 2816):
        row, branch = rows[f"{ident}@{tokens}"], _budget(d, tokens)
        assert (row["tokens"], row["final_val_loss"], row["best_val_loss"]) == (
            tokens, branch["final_val_loss"], branch["best_val_loss"])
        # metrics.jsonl and probes/ follow the main run: only the largest budget's row names them.
        assert pd.notna(row["metrics_path"]) == (tokens == 2816)
    assert rows[f"{ident}@2816"]["final_val_loss"] == d.read_result()["final_val_loss"]
    assert pd.isna(rows[f"{half.identity()}@2560"]["final_val_loss"])
    # What belongs to the trial, not the budget, is on every one of its rows.
    assert list(df["workers"]) == [1] * 6 + [None if pd.isna(df["workers"].iloc[6]) else 1]
    assert df["n_params"].iloc[:3].nunique() == 1 and df["n_params"].iloc[:3].notna().all()
    # The report's loader keeps every budget's row (it drops duplicate identities).
    write_table(tmp_path, df)
    sweep = load([tmp_path])
    assert sorted(sweep.complete["tokens"]) == [1280, 1280, 2560, 2816]

    # The half-done trial resumes from its checkpoint (the first fork's, step 8: the stop at 12
    # came before that step's checkpoint) and trains only the budgets it lacks.
    half_dir, lines = TrialDir.in_sweep(tmp_path, half.identity()), []
    first = half_dir.budget_json(1280).read_bytes()
    run_trial(half, half_dir.path, log=_quiet(lines))
    assert [line.split(" tokens")[0] for line in lines if line.startswith(("budget ", "resuming"))] == [
        f"resuming {half.identity()} from step 8/22 (budgets done: 1280)", "budget 2,560"]
    assert half_dir.budget_json(1280).read_bytes() == first
    df = build_table(tmp_path, states)
    assert list(df[schema.STATE]) == ["COMPLETE"] * 6 + ["INTERRUPTED"]


@pytest.mark.slow
def test_a_sweep_with_budgets_writes_a_row_per_budget(data_cache, tmp_path):
    import optuna

    # 8 steps: budgets of 4 and 8 steps, cooldowns of 1 and 2, forks at 3 and 6.
    proc = sweep(tmp_path, data_cache, "optim.schedule=wsd", "train.budgets=[512,1024]", "train.cooldown_frac=0.25",
                 "seed=0,1", "wandb.mode=disabled", "name=budgets")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "budgets"
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(df) == 4 and set(df["state"]) == {"COMPLETE"} and df["identity"].is_unique
    assert sorted(df["budget_tokens"]) == [512, 512, 1024, 1024] and (df["tokens"] == df["budget_tokens"]).all()
    assert (df["identity"] == df["trial_identity"] + "@" + df["budget_tokens"].astype(str)).all()
    study = optuna.load_study(study_name="budgets", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    values = {t.user_attrs["identity"]: t.value for t in study.get_trials(deepcopy=False)}
    largest = df[df["budget_tokens"] == 1024].set_index("trial_identity")["final_val_loss"]
    assert values == pytest.approx(largest.to_dict())  # the study sees each trial's own (largest) result
    for ident in df["trial_identity"].unique():
        assert sorted(p.name for p in (sweep_dir / "trials" / ident / "budgets").iterdir()) == ["1024.json", "512.json"]
