"""Study (sweeper/study/study.py) on a real SQLite file: what one call records, that an ended trial
stays as it ended, and what a rerun (a new Study on the same file) finds by identity."""

from __future__ import annotations

import math
import shutil

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from smallinit.core.errors import ConfigError
from smallinit.sweeper.study.study import (
    SAMPLED,
    TRIAL_DIR,
    Study,
    default_storage_url,
    make_sampler,
    open_storage,
    redacted,
)

DISTS = {"init.gamma": FloatDistribution(0.5, 1.25)}


@pytest.fixture
def sweep(study_folder):
    return study_folder


def _study(sweep_dir, name: str = "s") -> Study:
    """A driver's view of the sweep folder's study; a second call is a rerun's view."""
    return Study(open_storage(default_storage_url(sweep_dir)), name, optuna.samplers.RandomSampler(seed=0))


def _trials(study: Study) -> list:
    return study.study.get_trials(deepcopy=True)


def test_create_running_records_params_identity_folder_and_role_in_the_one_trial_it_creates(sweep):
    study = _study(sweep)
    folder = sweep / "trials" / "abc"
    t = study.create_running({"init.gamma": 0.75}, DISTS, identity="abc", trial_dir=str(folder), role="tune")
    # What a rerun reads from the file, not what this process cached.
    (stored,) = _trials(_study(sweep))
    assert stored.number == t.number == 0
    assert stored.state == TrialState.RUNNING
    assert stored.params == {"init.gamma": 0.75}
    assert stored.distributions == DISTS
    assert stored.user_attrs == {"identity": "abc", TRIAL_DIR: "trials/abc", "role": "tune", SAMPLED: False}


def test_create_running_records_only_the_distributions_of_its_params(sweep):
    study = _study(sweep)
    dists = {**DISTS, "seed": CategoricalDistribution([0, 1])}
    t = study.create_running({"seed": 1}, dists, identity="s1")
    assert study.storage.get_trial(t._trial_id).distributions == {"seed": CategoricalDistribution([0, 1])}


def test_trial_folders_are_stored_relative_so_a_moved_sweep_folder_still_finds_them(tmp_path, empty_study_db):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    shutil.copy(empty_study_db, old / "optuna.db")
    study = _study(old)
    study.create_running({"init.gamma": 1.0}, DISTS, identity="abc", trial_dir=str(old / "trials" / "abc"))
    outside = tmp_path / "elsewhere" / "xyz"
    study.create_running({"init.gamma": 0.5}, DISTS, identity="xyz", trial_dir=str(outside))
    shutil.copytree(old, new)
    moved = _study(new)
    found = moved.by_identity()
    assert found["abc"].user_attrs[TRIAL_DIR] == str(new / "trials" / "abc")
    assert found["xyz"].user_attrs[TRIAL_DIR] == str(outside)  # outside the folder: kept absolute
    # by_identity hands out copies: the storage's cached trial still holds the stored text.
    assert moved.study.get_trials(deepcopy=False)[0].user_attrs[TRIAL_DIR] == "trials/abc"


def test_finish_complete_records_the_value(sweep):
    study = _study(sweep)
    t = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    study.finish(t, TrialState.COMPLETE, 6.25)
    (stored,) = _trials(study)
    assert (stored.state, stored.value) == (TrialState.COMPLETE, 6.25)
    assert "fail_reason" not in stored.user_attrs


def test_finish_fail_records_the_reason_and_no_value(sweep):
    study = _study(sweep)
    t = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    study.finish(t, TrialState.FAIL, 6.25, reason="TrialDiverged: loss nan at step 3")
    (stored,) = _trials(study)
    assert (stored.state, stored.value) == (TrialState.FAIL, None)
    assert stored.user_attrs["fail_reason"] == "TrialDiverged: loss nan at step 3"


def test_a_complete_without_a_finite_loss_is_recorded_as_failed(sweep):
    study = _study(sweep)
    for value in (None, math.nan, -math.inf):
        study.finish(study.create_running({"init.gamma": 1.0}, DISTS, identity=str(value)), TrialState.COMPLETE, value)
    assert [(t.state, t.value, t.user_attrs["fail_reason"]) for t in _trials(study)] == [
        (TrialState.FAIL, None, "no finite validation loss")] * 3


def test_a_long_failure_reason_is_cut_to_2000_characters(sweep):
    study = _study(sweep)
    t = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    study.finish(t, TrialState.FAIL, reason="x" * 5000)
    assert _trials(study)[0].user_attrs["fail_reason"] == "x" * 2000


def test_an_ended_trial_is_never_changed_by_a_later_finish(sweep):
    study = _study(sweep)
    t = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    study.finish(t, TrialState.COMPLETE, 6.25)
    study.finish(t, TrialState.COMPLETE, 5.0)  # skipped: it ended already
    study.finish(t, TrialState.PRUNED)
    study.finish(t, TrialState.FAIL, reason="late")  # neither raises nor records the reason
    study.finish(t, TrialState.COMPLETE, math.nan)
    (stored,) = _trials(study)
    assert (stored.state, stored.value) == (TrialState.COMPLETE, 6.25)
    assert "fail_reason" not in stored.user_attrs


def test_report_records_finite_intermediate_values_only(sweep):
    study = _study(sweep)
    t = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    for step, value in ((4, 7.5), (8, math.nan), (12, math.inf), (16, 6.75)):
        study.report(t, step, value)
    assert _trials(study)[0].intermediate_values == {4: 7.5, 16: 6.75}


def test_ask_marks_the_trial_as_sampled_and_set_attrs_names_it(sweep):
    study = _study(sweep)
    t = study.ask(DISTS)
    study.set_attrs(t, identity="s", trial_dir=str(sweep / "trials" / "s"))
    (stored,) = _trials(study)
    assert 0.5 <= stored.params["init.gamma"] <= 1.25
    assert stored.user_attrs == {SAMPLED: True, "identity": "s", TRIAL_DIR: "trials/s"}


def test_a_rerun_finds_each_trial_by_identity_and_creates_none(sweep):
    first = _study(sweep)
    done = first.create_running({"init.gamma": 0.5}, DISTS, identity="done")
    first.finish(done, TrialState.COMPLETE, 6.0)
    left = first.create_running({"init.gamma": 1.0}, DISTS, identity="left")  # the driver was killed here
    rerun = _study(sweep)
    found = rerun.by_identity()
    assert {k: (t.number, t.state) for k, t in found.items()} == {
        "done": (done.number, TrialState.COMPLETE), "left": (left.number, TrialState.RUNNING)}
    assert len(_trials(rerun)) == 2


def test_by_identity_prefers_an_ended_trial_and_then_the_latest(sweep):
    study = _study(sweep)
    failed = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    study.finish(failed, TrialState.FAIL, reason="OSError: disk")
    retried = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    study.finish(retried, TrialState.COMPLETE, 6.5)
    study.create_running({"init.gamma": 1.0}, DISTS, identity="a")  # RUNNING, after both
    study.create_running({"init.gamma": 0.5}, DISTS)  # unnamed: a driver killed between two writes
    found = study.by_identity()
    assert list(found) == ["a"]
    assert (found["a"].number, found["a"].state) == (retried.number, TrialState.COMPLETE)


def test_a_superseded_trial_no_longer_counts_and_the_mark_is_per_trial(sweep):
    study = _study(sweep)
    old = study.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    study.finish(old, TrialState.COMPLETE, 6.5)
    other = study.create_running({"init.gamma": 0.5}, DISTS, identity="b")
    study.finish(other, TrialState.COMPLETE, 6.0)
    study.supersede(old, "its folder is gone")
    rerun = _study(sweep)  # a second driver's mark keeps the first
    rerun.supersede(other, "result.json was damaged")
    assert rerun.superseded() == {old.number: "its folder is gone", other.number: "result.json was damaged"}
    assert rerun.by_identity() == {}
    again = rerun.create_running({"init.gamma": 1.0}, DISTS, identity="a")
    assert rerun.by_identity()["a"].number == again.number == 2


def test_make_sampler_refuses_an_interval_for_a_grid_and_an_unknown_name():
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.sampler='grid' is invalid with the interval init.gamma: "
                                          r"use discrete values$"):
        make_sampler("grid", 0, DISTS)
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.sampler='bayes' is invalid: one of "
                                          r"\['tpe', 'random', 'gp', 'grid'\]$"):
        make_sampler("bayes", 0, DISTS)
    grid = make_sampler("grid", 0, {"seed": CategoricalDistribution([0, 1, 2])})
    assert isinstance(grid, optuna.samplers.GridSampler)


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://ann:secret@db.lab:5432/sweeps", "postgresql://ann:***@db.lab:5432/sweeps"),
    ("postgresql://ann@db.lab/sweeps", "postgresql://ann@db.lab/sweeps"),
    ("sqlite:///a/b.db", "sqlite:///a/b.db"),
])
def test_redacted_hides_only_the_password(url, shown):
    assert redacted(url) == shown


def test_a_file_that_is_not_a_database_is_refused_in_one_line_naming_it(tmp_path):
    bad = tmp_path / "optuna.db"
    bad.write_text("not a database\n" * 100)
    with pytest.raises(ConfigError) as e:
        open_storage(f"sqlite:///{bad}")
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_the_dashboard_names_a_damaged_study_in_one_line(tmp_path, capsys):
    from smallinit.sweeper.study.dashboard import main

    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "optuna.db").write_bytes(b"not a database at all" * 100)
    assert main([str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a readable SQLite study" in err and err.count("\n") == 1
