"""Every file read back is checked to belong to its trial (issue #41): another trial's
result.json, budget file or model.pt copied into a folder is named in one line and not used;
a trial whose settings cannot be read still has a row; the paths a record stores are relative,
so a copied sweep folder reads its own files. Unit tests on TrialDir, the results table and
reconcile; one tiny real run for the trainer's resume past a foreign budget file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import asdict

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from smallinit.core import results_schema as schema
from smallinit.core.trial_dir import TrialDir
from smallinit.model.config import InitConfig, ModelConfig
from smallinit.sweeper.results.results import build_table
from smallinit.sweeper.results.summary import failure_lines
from smallinit.sweeper.study.study import Study
from smallinit.sweeper.study.study_rebuild import reconcile
from smallinit.trainer.config import OptimConfig, TrainConfig, TrialConfig
from smallinit.trainer.folder_checks import budgets_done
from smallinit.trainer.loop import TrialResult, run_trial
from smallinit.trainer.schedule import Branch

from .conftest import REPO, StopAt

DISTS = {"init.gamma": FloatDistribution(0.5, 2.0)}


def _trial(gamma: float) -> TrialConfig:
    model = ModelConfig.preset("nano", init=InitConfig(gamma=gamma))
    return TrialConfig(model=model, optim=OptimConfig(), train=TrainConfig(), preset="nano")


def _result(identity: str, loss: float, budget_tokens: int | None = None, d: TrialDir | None = None) -> dict:
    """A result.json (or budget file) as trainer.loop writes it."""
    artifacts = d.artifacts(per_token_losses=True) if d is not None else {}
    return asdict(TrialResult(identity=identity, steps=8, tokens=1024, n_params=5000, final_val_loss=loss,
                              best_val_loss=loss, unigram_entropy=7.0, wall_s=1.0, tokens_per_s=1000.0, mfu=None,
                              artifacts=artifacts, budget_tokens=budget_tokens))


def _finished(sweep_dir, gamma: float, loss: float, budgets: list[int] | None = None) -> TrialDir:
    """A finished trial folder, as a sweep leaves it (budget files too with `budgets`)."""
    trial = _trial(gamma)
    ident, config = trial.identity(), trial.to_dict()
    if budgets:
        config["train"]["budgets"] = budgets
    d = TrialDir.in_sweep(sweep_dir, ident)
    d.write_sweep_plan({"init.gamma": gamma}, [f"init.gamma={gamma}"], ident, config)
    d.write_trial(ident, config)
    for tokens in budgets or []:
        d.write_budget_result(tokens, _result(ident, loss + 1 - tokens / max(budgets), tokens))
    d.per_token_losses.write_bytes(b"npz")
    d.write_result(_result(ident, loss, max(budgets) if budgets else None, d))
    return d


def _study(tmp_path) -> Study:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    return Study(storage, "s", optuna.samplers.RandomSampler(seed=0))


def _complete(study: Study, d: TrialDir, gamma: float) -> None:
    t = study.create_running({"init.gamma": gamma}, DISTS, identity=d.identity, trial_dir=str(d.path))
    study.finish(t, TrialState.COMPLETE, 6.0)


def _rows(sweep_dir) -> dict[str, dict]:
    return {r[schema.IDENTITY]: r for r in build_table(sweep_dir).to_dict("records")}


# ---- (a) result.json ----

def test_another_trials_result_json_is_not_this_trials_result(tmp_path):
    a, b = _finished(tmp_path, 0.5, 4.0), _finished(tmp_path, 1.0, 3.0)
    assert a.damaged_result() is None and b.damaged_result() is None
    shutil.copy(a.result_json, b.result_json)  # b now "reports" a's loss
    why = b.damaged_result()
    assert why.startswith("another trial's file") and a.identity in why and b.identity in why
    row = _rows(tmp_path)[b.identity]
    assert row[schema.STATE] == schema.FAIL and pd_isna(row[schema.FINAL_VAL_LOSS])
    assert row[schema.FAIL_REASON].startswith("result.json is another trial's file")
    assert "trains the trial again" in row[schema.FAIL_REASON]
    # Outside a sweep the folder's identity is what trial.json records.
    run = TrialDir(tmp_path / "runs" / "r1")
    run.write_trial(b.identity, {})
    shutil.copy(a.result_json, run.result_json)
    assert run.own_identity() == b.identity and run.damaged_result().startswith("another trial's file")


def pd_isna(v) -> bool:
    return v is None or v != v


def test_reconcile_sets_a_foreign_result_json_aside_in_one_line_and_the_trial_trains_again(tmp_path):
    study, sweep_dir = _study(tmp_path), tmp_path / "sweep"
    a, b = _finished(sweep_dir, 0.5, 4.0), _finished(sweep_dir, 1.0, 3.0)
    _complete(study, a, 0.5)
    _complete(study, b, 1.0)
    shutil.copy(a.result_json, b.result_json)
    (line,) = reconcile(study, sweep_dir)
    assert f"trials/{b.identity}/result.json is another trial's file" in line and a.identity in line
    assert "set aside as result.json.corrupt-" in line and line.endswith("the trial trains again")
    assert not b.finished and set(study.by_identity()) == {a.identity}  # b trains again
    assert "another trial's file" in next(iter(study.superseded().values()))
    assert reconcile(study, sweep_dir) == []


# ---- (b) budgets/<tokens>.json ----

def test_a_budget_file_of_another_trial_or_budget_is_not_reported(tmp_path):
    a = _finished(tmp_path, 0.5, 4.0, budgets=[1280, 2560])
    b = _finished(tmp_path, 1.0, 3.0, budgets=[1280, 2560])
    assert a.damaged_budget(1280) is None and a.planned_budgets() == [1280, 2560]
    shutil.copy(a.budget_json(1280), b.budget_json(1280))  # another trial's
    assert b.damaged_budget(1280).startswith("another trial's file")
    shutil.copy(a.budget_json(1280), a.budget_json(2560))  # another budget's
    assert a.damaged_budget(2560).startswith("another budget's file: it holds the 1280-token")
    old = json.loads(b.budget_json(2560).read_text())
    del old["budget_tokens"]  # written before budget_tokens was recorded: nothing to hold it to
    b.write_budget_result(2560, old)
    assert b.damaged_budget(2560) is None
    rows = _rows(tmp_path)
    assert rows[f"{b.identity}@1280"][schema.STATE] == schema.FAIL
    assert rows[f"{b.identity}@1280"][schema.FAIL_REASON].endswith(
        "is another trial's file: it holds trial " f"{a.identity}'s result, this folder is trial {b.identity}: "
        "the next run of the sweep trains the trial again")
    assert "rewrites it from result.json" in rows[f"{a.identity}@2560"][schema.FAIL_REASON]
    assert rows[f"{b.identity}@2560"][schema.STATE] == schema.COMPLETE


def test_reconcile_heals_a_finished_trials_budget_files(tmp_path):
    """The largest budget's file is rewritten from result.json; a smaller one's branch forked
    from a state that is gone, so the trial trains again. One line per file."""
    study, sweep_dir = _study(tmp_path), tmp_path / "sweep"
    a = _finished(sweep_dir, 0.5, 4.0, budgets=[1280, 2560])
    b = _finished(sweep_dir, 1.0, 3.0, budgets=[1280, 2560])
    c = _finished(sweep_dir, 1.5, 3.5, budgets=[1280, 2560])
    for d, g in ((a, 0.5), (b, 1.0), (c, 1.5)):
        _complete(study, d, g)
    a.budget_json(2560).write_text('{"identity": "cut')
    shutil.copy(a.budget_json(1280), b.budget_json(1280))
    lines = reconcile(study, sweep_dir)
    assert len(lines) == 2, lines
    (healed,) = [x for x in lines if f"{a.identity}/budgets/2560.json" in x]
    assert "is damaged (not readable JSON" in healed and healed.endswith(
        "rewritten from result.json, which holds the same (largest) budget's result")
    assert a.read_budget_result(2560) == a.read_result() and a.finished
    (foreign,) = [x for x in lines if f"{b.identity}/budgets/1280.json" in x]
    assert "is another trial's file" in foreign and "set aside as 1280.json.corrupt-" in foreign
    assert foreign.endswith("the trial trains again to run that budget's branch") and not b.finished
    assert set(study.by_identity()) == {a.identity, c.identity}
    assert reconcile(study, sweep_dir) == []
    assert _rows(sweep_dir)[f"{a.identity}@2560"][schema.STATE] == schema.COMPLETE


def test_the_trainer_takes_a_branch_as_done_only_from_its_own_whole_file(tmp_path):
    """A damaged or foreign file is set aside in one line: the branch runs again at its fork,
    or, when the checkpoint is past the fork, the trial trains again from step 0."""
    d, lines = TrialDir(tmp_path / "run"), []
    side = [Branch(tokens=1280, steps=10, fork=8), Branch(tokens=2560, steps=20, fork=16)]
    d.write_budget_result(1280, _result("me", 4.0, 1280))
    assert budgets_done(d, side, "me", {"step": 12, "budgets_done": [1280]}, lines.append) == ({1280}, False)
    d.write_budget_result(1280, _result("other", 4.0, 1280))
    assert budgets_done(d, side, "me", {"step": 8, "budgets_done": []}, lines.append) == (set(), False)
    assert "runs again at its fork (step 8)" in lines[-1] and not d.budget_json(1280).exists()
    d.budget_json(1280).write_text("{")
    assert budgets_done(d, side, "me", {"step": 12, "budgets_done": [1280]}, lines.append) == (set(), True)
    assert "is damaged (not readable JSON" in lines[-1] and lines[-1].endswith(
        "the checkpoint (step 12) is past its fork (step 8): training the trial again from step 0")
    assert budgets_done(d, side, "me", {"step": 12, "budgets_done": [1280]}, lines.append) == (set(), True)
    assert lines[-1].startswith(f"{d.budget_json(1280)} is missing;")  # the checkpoint listed it
    assert len(lines) == 3 and len(list(d.budgets.glob("1280.json.corrupt-*"))) >= 1


def test_a_resume_past_a_foreign_budget_file_trains_again_from_step_0(trial_config, tmp_path):
    """Real: stopped at step 15 with a checkpoint at 12, past the 1280-token fork (8); that
    budget's file replaced by another trial's. The resume trains from step 0, runs the branch,
    and its result is the one the first run wrote."""
    from .test_budgets import BUDGETS, _quiet

    trial, d = trial_config(*BUDGETS), TrialDir(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        run_trial(trial, d.path, reporter=StopAt(13), log=lambda *_: None)
    own = d.read_budget_result(1280)
    assert own["identity"] == trial.identity() and not d.finished
    d.write_budget_result(1280, {**own, "identity": "0123456789ab", "final_val_loss": 1.0})
    lines: list[str] = []
    result = run_trial(trial, d.path, log=_quiet(lines))
    (line,) = [x for x in lines if "1280.json" in x]
    assert "another trial's file" in line and line.endswith("training the trial again from step 0")
    assert not any(x.startswith("resuming") for x in lines)
    assert d.read_budget_result(1280)["final_val_loss"] == pytest.approx(own["final_val_loss"], rel=1e-6)
    assert result.identity == trial.identity() and d.damaged_budget(1280) is None


# ---- (c) model.pt ----

def test_export_refuses_another_trials_model_pt_in_one_line(trial_config, tmp_path):
    import torch

    from smallinit.model import Transformer
    from smallinit.trainer.checkpoint import check_weights_owner
    from smallinit.trainer.export import ConfigError, _read_weights

    trial, d = trial_config("init.gamma=1.0"), TrialDir(tmp_path / "trial")
    d.write_trial(trial.identity(), trial.to_dict())
    weights = Transformer(trial.model).state_dict()
    torch.save({"identity": "0123456789ab", "step": 8, "model": weights}, d.model_weights)
    proc = subprocess.run([sys.executable, "-m", "smallinit.trainer.export", str(d.path), str(tmp_path / "hf")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert (f"{d.model_weights} holds trial 0123456789ab's weights, but {d.trial_json} is trial "
            f"{trial.identity()}: nothing exported") in proc.stderr
    assert not (tmp_path / "hf").exists()
    # A model.pt with no identity (not written by the trainer) loads, with a one-line note.
    torch.save({"step": 8, "model": weights}, d.model_weights)
    notes: list[str] = []
    check_weights_owner(d.model_weights, {"model": weights}, trial.identity(), d.trial_json, notes.append)
    assert len(notes) == 1 and "records no trial identity" in notes[0] and trial.identity() in notes[0]
    assert set(_read_weights(d.model_weights, torch, trial.identity(), d.trial_json)) == set(weights)
    with pytest.raises(ConfigError):
        check_weights_owner(d.model_weights, {"identity": "x"}, trial.identity(), d.trial_json)


# ---- (d) a trial whose settings cannot be read ----

def test_a_finished_trial_with_both_settings_files_damaged_is_a_fail_row(tmp_path):
    a, b = _finished(tmp_path, 0.5, 4.0), _finished(tmp_path, 1.0, 3.0)
    b.sweep_json.write_bytes(b"\x80 garbage")
    b.trial_json.write_text('{"identity": "')
    planned = TrialDir.in_sweep(tmp_path, "planned0only")  # killed before sweep.json: not planned yet
    planned.hydra_config.parent.mkdir(parents=True)
    rows = _rows(tmp_path)
    assert set(rows) == {a.identity, b.identity}
    row = rows[b.identity]
    assert row[schema.STATE] == schema.FAIL and row["trial_dir"] == f"trials/{b.identity}"
    assert row[schema.FAIL_REASON].startswith("sweep.json is damaged and trial.json is damaged: the trial's settings "
                                              "cannot be read")
    (line, trial_line) = failure_lines(build_table(tmp_path), tmp_path)
    assert line.startswith("failed (1 trial): sweep.json is damaged and trial.json is damaged") and b.identity in trial_line


# ---- (e) paths in records ----

def test_a_copied_sweep_folder_reads_its_own_files(tmp_path):
    d = _finished(tmp_path / "orig", 0.5, 4.0)
    assert d.read_result()["artifacts"]["per_token_losses"] == "per_token_losses.npz"  # relative to the folder
    old = d.read_result()
    old["artifacts"] = {k: str(d.path / v) if v else v for k, v in old["artifacts"].items()}  # an older record
    d.write_result(old)
    other = _finished(tmp_path / "orig", 1.0, 3.0)
    shutil.copytree(tmp_path / "orig", tmp_path / "copy")
    rows = _rows(tmp_path / "copy")
    for ident in (d.identity, other.identity):
        assert rows[ident]["per_token_losses_path"] == f"trials/{ident}/per_token_losses.npz"
    copy = TrialDir.in_sweep(tmp_path / "copy", d.identity)
    assert copy.artifact(old["artifacts"]["per_token_losses"]) == copy.per_token_losses  # its own, not orig's
    assert copy.artifact("probes") == copy.probes and copy.artifact("") is None
    elsewhere = str(tmp_path / "x" / "per_token_losses.npz")  # an absolute path not of this folder: as stored
    assert str(copy.artifact(elsewhere)) == elsewhere
    # An older table's absolute path names the original folder, which still exists: the copy reads its own.
    stored = str(d.per_token_losses)
    assert schema.to_local_path(stored, tmp_path / "copy", d.identity) == str(copy.per_token_losses)


def test_export_from_a_trial_with_a_damaged_trial_json_is_one_line(tmp_path):
    d = TrialDir(tmp_path / "trial")
    d.path.mkdir()
    d.trial_json.write_text("{bad")
    proc = subprocess.run([sys.executable, "-m", "smallinit.trainer.export", str(d.path), str(tmp_path / "hf")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {d.trial_json} is damaged (") and "restore it" in proc.stderr
    assert not (tmp_path / "hf").exists()
