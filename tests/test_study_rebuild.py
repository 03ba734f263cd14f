"""The trial folders are the truth the study is reconciled with before a sweep plans: real
SQLite studies, trial folders written as a worker writes them."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.study.study import Study
from smallinit.sweeper.study.study_rebuild import reconcile, restore_from_folders

DISTS = {"init.gamma": FloatDistribution(0.5, 1.25)}


def _result(identity: str, loss) -> dict:
    """A result.json as trainer.loop writes it."""
    return {"identity": identity, "steps": 8, "tokens": 1024, "n_params": 5000, "final_val_loss": loss,
            "best_val_loss": loss, "unigram_entropy": 7.0, "wall_s": 1.0, "tokens_per_s": 1000.0, "mfu": None}


def _study(tmp_path) -> Study:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    return Study(storage, "s", optuna.samplers.RandomSampler(seed=0))


def _folder(sweep_dir, identity: str, gamma: float) -> TrialDir:
    d = TrialDir.in_sweep(sweep_dir, identity)
    d.path.mkdir(parents=True)
    d.write_sweep_plan({"init.gamma": gamma}, [f"init.gamma={gamma}"], identity, {})
    return d


def _running(study: Study, identity: str, gamma: float, d: TrialDir):
    t = study.create_running({"init.gamma": gamma}, DISTS)
    study.set_attrs(t, identity=identity, trial_dir=str(d.path))
    study.report(t, 8, 7.5)
    return t


def test_a_trial_left_running_whose_folder_finished_is_closed_as_the_folder_says(tmp_path):
    """The driver was killed between the worker's result.json and its tell to the study."""
    study, sweep_dir = _study(tmp_path), tmp_path / "sweep"
    done, failed, live = (_folder(sweep_dir, name, g) for name, g in (("done", 0.5), ("bad", 1.0), ("live", 1.25)))
    for name, d, g in (("done", done, 0.5), ("bad", failed, 1.0), ("live", live, 1.25)):
        _running(study, name, g, d)
    done.write_result(_result("done", 6.25))
    failed.write_failure("diverged: loss nan at step 3", "tb", kind="permanent")

    assert restore_from_folders(study, sweep_dir, DISTS) == (0, 2)
    trials = {t.user_attrs["identity"]: t for t in study.study.get_trials()}
    assert len(trials) == 3
    assert trials["done"].state == TrialState.COMPLETE and trials["done"].value == 6.25
    assert trials["done"].intermediate_values == {8: 7.5}  # what it reported while it ran is kept
    assert trials["bad"].state == TrialState.FAIL
    assert trials["bad"].user_attrs["fail_reason"] == "diverged: loss nan at step 3"
    assert trials["bad"].user_attrs["fail_kind"] == "permanent"
    assert trials["live"].state == TrialState.RUNNING  # no result yet: the plan resumes it
    assert restore_from_folders(study, sweep_dir, DISTS) == (0, 0)  # nothing left to reconcile


def test_a_damaged_result_closes_the_trial_as_failed_and_says_which_file(tmp_path):
    study, sweep_dir = _study(tmp_path), tmp_path / "sweep"
    d = _folder(sweep_dir, "cut", 1.0)
    _running(study, "cut", 1.0, d)
    d.result_json.write_text('{"final_val_loss": 6.2')  # cut off mid-write (not by atomic_write_json)
    assert restore_from_folders(study, sweep_dir, DISTS) == (0, 1)
    (t,) = study.study.get_trials()
    assert t.state == TrialState.FAIL
    assert t.user_attrs["fail_reason"] == ("result.json is damaged (not readable JSON (cut off or overwritten)): "
                                           "the next run of the sweep sets it aside and trains it again")


def test_a_finished_folder_the_study_lacks_is_recorded_once(tmp_path):
    study, sweep_dir = _study(tmp_path), tmp_path / "sweep"
    _folder(sweep_dir, "a", 0.75).write_result(_result("a", 6.5))
    _folder(sweep_dir, "b", 1.0)  # planned, never ended: left to the plan
    assert restore_from_folders(study, sweep_dir, DISTS) == (1, 0)
    (t,) = study.study.get_trials()
    assert t.state == TrialState.COMPLETE and t.value == 6.5 and t.params == {"init.gamma": 0.75}
    assert t.user_attrs["restored_from_folder"] is True
    assert restore_from_folders(study, sweep_dir, DISTS) == (0, 0)


def test_reconcile_sets_damaged_results_aside_and_supersedes_trials_their_folders_lost(tmp_path):
    """Every way a finished trial's folder can stop showing it, each named in one line."""
    study, sweep_dir = _study(tmp_path), tmp_path / "sweep"
    damaged = {"garbage": b"\x80\x81\xfe binary", "half": b'{"identity": "half", "steps": 8, "fin',
               "schema": b'{"identity": "schema", "final_val_loss": 6.0}', "nan": None}
    for i, name in enumerate([*damaged, "gone", "missing", "whole", "elsewhere"]):
        d = _folder(sweep_dir, name, 0.5 + i / 16)
        t = _running(study, name, 0.5 + i / 16, d)
        if name == "elsewhere":  # a shared study's trial in another sweep folder: not ours to judge
            study.set_attrs(t, trial_dir=str(tmp_path / "other_sweep" / "trials" / name))
        d.write_result(_result(name, float("nan") if name == "nan" else 6.0))
        study.finish(t, TrialState.COMPLETE, 6.0)
        if damaged.get(name):
            d.result_json.write_bytes(damaged[name])
    (sweep_dir / "trials" / "gone").rename(tmp_path / "gone")  # rm -rf trials/<id>
    TrialDir.in_sweep(sweep_dir, "missing").result_json.unlink()

    lines = reconcile(study, sweep_dir)
    assert len(lines) == 6, lines
    for name in damaged:
        (line,) = [x for x in lines if f"trials/{name}/result.json is damaged" in x]
        assert line.endswith("the trial trains again") and "set aside as result.json.corrupt-" in line
    assert any("(final_val_loss=nan is not a finite number)" in x for x in lines)
    assert any("(no steps, tokens, n_params, best_val_loss" in x for x in lines)
    assert any("trials/gone is gone" in x for x in lines) and any("trials/missing/result.json is missing" in x
                                                                    for x in lines)
    assert len(study.superseded()) == 6
    assert set(study.by_identity()) == {"whole", "elsewhere"}
    assert len(list((sweep_dir / "trials" / "garbage").glob("result.json.corrupt-*"))) == 1
    assert reconcile(study, sweep_dir) == []  # said once
