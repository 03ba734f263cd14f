"""What a sweep plans against its study (sweeper/study/plan.py): which points are skipped, which
resume the trial a killed driver left RUNNING, which failures run again. A real SQLite study
and real trial folders; the composer is a stand-in that names each point and notes the folders
it was asked to write (the real one composes Hydra configs, ~0.2 s a point)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.config.config import SmallinitSweeperConf
from smallinit.sweeper.config.space import parse_sweep
from smallinit.sweeper.study.plan import _left_to_run, to_run
from smallinit.sweeper.study.study import Study, default_storage_url, open_storage
from smallinit.sweeper.worker.failures import PERMANENT, TRANSIENT, WORKER_CRASHED

GRID = parse_sweep(["init.gamma=0.5,0.75,1.0,1.25"])
SEARCH = parse_sweep(["init.gamma=interval(0.5,1.25)"])
DISTS = {"init.gamma": FloatDistribution(0.5, 1.25)}


class Points:
    """composer.spec(params, write): a point's identity is its gamma; `written` lists the
    identities whose folders the plan asked for, in order."""

    def __init__(self, sweep_dir):
        self.sweep_dir, self.written = sweep_dir, []

    def spec(self, params, write=False):
        identity = f"g{params['init.gamma']}"
        if write:
            self.written.append(identity)
        return SimpleNamespace(identity=identity, params=dict(params), role=None,
                               out_dir=str(TrialDir.in_sweep(self.sweep_dir, identity).path))


@pytest.fixture
def sweep(study_folder):
    study = Study(open_storage(default_storage_url(study_folder)), "s", optuna.samplers.RandomSampler(seed=0))
    return SimpleNamespace(dir=study_folder, study=study, points=Points(study_folder))


def _trial(sweep, gamma, state=TrialState.RUNNING, value=None, **attrs):
    """A study trial of the point, ended as `state` (with fail_reason/fail_kind in attrs)."""
    spec = sweep.points.spec({"init.gamma": gamma})
    reason = attrs.pop("fail_reason", None)
    t = sweep.study.create_running(spec.params, DISTS, identity=spec.identity, trial_dir=spec.out_dir, **attrs)
    if state != TrialState.RUNNING:
        sweep.study.finish(t, state, value, reason)
    return t


def _plan(sweep, space, n_trials=20, retry_failed=False):
    """(pending, n_new, skipped, total). A grid's pending trials are claimed in the study by the
    plan: a trial it created there reads as new (existing None), one it reuses as resumed."""
    conf = SmallinitSweeperConf(n_trials=n_trials, retry_failed=retry_failed)
    specs = [sweep.points.spec(p) for p in space.grid()] if space.mode == "grid" else []
    before = {t.number for t in sweep.study.study.get_trials(deepcopy=False)}
    grid = sweep.study.grid_distributions(space) if space.mode == "grid" else None
    pending, n_new, skipped, total, _ = _left_to_run(conf, space, sweep.study, specs, sweep.points, grid)
    claimed = [t for p in pending if (t := p.existing) is not None and t.number not in before]
    assert all(t.state == TrialState.RUNNING and t.user_attrs["identity"] for t in claimed)
    pending = [dataclasses.replace(p, existing=None) if p.existing in claimed else p for p in pending]
    return pending, n_new, skipped, total


def _pending(pending) -> list[tuple[str, int | None]]:
    """(identity, number of the study trial it resumes, or None for a new one) per pending trial."""
    return [(p.spec.identity, p.existing.number if p.existing else None) for p in pending]


def test_a_new_grid_plans_every_point_and_writes_its_folder(sweep):
    pending, n_new, skipped, total = _plan(sweep, GRID)
    assert _pending(pending) == [("g0.5", None), ("g0.75", None), ("g1.0", None), ("g1.25", None)]
    assert (n_new, skipped, total) == (0, 0, 4)
    assert sweep.points.written == ["g0.5", "g0.75", "g1.0", "g1.25"]


def test_a_grid_rerun_skips_ended_points_and_resumes_the_running_one(sweep):
    _trial(sweep, 0.5, TrialState.COMPLETE, 6.0)
    _trial(sweep, 0.75, TrialState.PRUNED)
    left = _trial(sweep, 1.0)  # the killed driver's
    pending, n_new, skipped, total = _plan(sweep, GRID)
    assert _pending(pending) == [("g1.0", left.number), ("g1.25", None)]
    assert (n_new, skipped, total) == (0, 2, 4)
    assert sweep.points.written == ["g1.0", "g1.25"]  # an ended point's folder is not rewritten


def test_the_plan_line_says_what_resumes_from_a_checkpoint_and_what_is_new(sweep):
    _trial(sweep, 0.5, TrialState.COMPLETE, 6.0)
    _trial(sweep, 0.75)  # a killed driver's: its folder holds a checkpoint
    _trial(sweep, 1.0)  # killed before its first checkpoint: it starts from step 0
    folder = TrialDir.in_sweep(sweep.dir, "g0.75")
    folder.path.mkdir(parents=True)
    folder.checkpoint.write_bytes(b"state")
    sharded = TrialDir.in_sweep(sweep.dir, "g1.25")  # a several-worker trial's checkpoint
    sharded.checkpoint_dcp.mkdir(parents=True)
    pending, n_new, skipped, total = _plan(sweep, GRID)
    assert (skipped, total) == (1, 4)
    assert to_run(pending, n_new) == "to run: 2 resume from a checkpoint, 1 new"
    assert to_run(pending[:0], 3) == "to run: 0 resume from a checkpoint, 3 new"  # a search's new samples
    assert to_run([], 0) == "nothing to run"


def test_a_grid_point_whose_folder_holds_a_result_is_skipped_whatever_the_study_says(sweep):
    TrialDir.in_sweep(sweep.dir, "g1.25").path.mkdir(parents=True)
    TrialDir.in_sweep(sweep.dir, "g1.25").write_result({"final_val_loss": 6.0})
    _trial(sweep, 1.25)  # RUNNING in the study: the folder wins
    pending, _, skipped, _ = _plan(sweep, GRID)
    assert [i for i, _ in _pending(pending)] == ["g0.5", "g0.75", "g1.0"]
    assert skipped == 1


@pytest.mark.parametrize(("attrs", "retry_failed", "runs_again"), [
    ({"fail_reason": "TrialDiverged: loss nan", "fail_kind": PERMANENT}, False, False),
    ({"fail_reason": "TrialDiverged: loss nan"}, False, False),  # no kind recorded: the trial's own
    ({"fail_reason": "TrialDiverged: loss nan", "fail_kind": PERMANENT}, True, True),
    ({"fail_reason": "no space left on device: x", "fail_kind": TRANSIENT}, False, True),
    ({"fail_reason": WORKER_CRASHED}, False, True),  # studies from before kinds: named by reason
])
def test_a_failed_grid_point_runs_again_only_for_the_environments_fault_or_retry_failed(
        sweep, attrs, retry_failed, runs_again):
    _trial(sweep, 0.5, TrialState.FAIL, **attrs)
    pending, _, skipped, _ = _plan(sweep, GRID, retry_failed=retry_failed)
    assert (("g0.5", None) in _pending(pending), "g0.5" in sweep.points.written) == (runs_again, runs_again)
    assert skipped == (0 if runs_again else 1)


def test_a_failure_json_decides_over_the_studys_kind(sweep):
    _trial(sweep, 0.5, TrialState.FAIL, fail_reason="x", fail_kind=PERMANENT)
    folder = TrialDir.in_sweep(sweep.dir, "g0.5")
    folder.path.mkdir(parents=True)
    folder.write_failure("no space left on device: x", "tb", kind=TRANSIENT)
    pending, _, skipped, _ = _plan(sweep, GRID)
    assert _pending(pending)[0] == ("g0.5", None) and skipped == 0
    folder.write_failure("TrialDiverged: loss nan", "tb", kind=PERMANENT)
    sweep.points.written.clear()
    pending, _, skipped, _ = _plan(sweep, GRID)
    assert "g0.5" not in sweep.points.written and skipped == 1


def test_a_superseded_grid_point_trains_again_as_a_new_trial(sweep):
    old = _trial(sweep, 0.5, TrialState.COMPLETE, 6.0)
    sweep.study.supersede(old, "its folder is gone")
    pending, _, skipped, _ = _plan(sweep, GRID)
    assert _pending(pending)[0] == ("g0.5", None) and skipped == 0


def test_a_grid_rerun_after_a_kill_creates_no_second_trial_for_any_point(sweep):
    """Driver one claims its four points in the study as it plans, finishes one and is killed; the
    rerun hands the other three back to itself, each as the study trial claimed for it."""
    conf = SmallinitSweeperConf()
    specs = [sweep.points.spec(p) for p in GRID.grid()]
    first = _left_to_run(conf, GRID, sweep.study, specs, sweep.points, sweep.study.grid_distributions(GRID))[0]
    claimed = [p.existing for p in first]
    assert [t.state for t in claimed] == [TrialState.RUNNING] * 4
    sweep.study.finish(claimed[0], TrialState.COMPLETE, 6.0)
    rerun = Study(open_storage(default_storage_url(sweep.dir)), "s", optuna.samplers.RandomSampler(seed=0))
    pending, _, skipped, _, _ = _left_to_run(conf, GRID, rerun, specs, sweep.points, rerun.grid_distributions(GRID))
    assert _pending(pending) == [(s.identity, t.number) for s, t in zip(specs[1:], claimed[1:])]
    assert skipped == 1 and len(rerun.study.get_trials(deepcopy=False)) == 4


def test_a_search_counts_ended_trials_resumes_running_ones_and_asks_for_the_rest(sweep):
    _trial(sweep, 0.5, TrialState.COMPLETE, 6.0)
    _trial(sweep, 0.6, TrialState.PRUNED)
    _trial(sweep, 0.7, TrialState.FAIL, fail_reason="TrialDiverged", fail_kind=PERMANENT)
    left = _trial(sweep, 0.8)
    pending, n_new, skipped, total = _plan(sweep, SEARCH, n_trials=6)
    assert _pending(pending) == [("g0.8", left.number)]
    assert (n_new, skipped, total) == (6 - 3 - 1, 3, 6)
    assert sweep.points.written == ["g0.8"]


def test_a_search_that_holds_its_trials_asks_for_none(sweep):
    for gamma in (0.5, 0.6, 0.7):
        _trial(sweep, gamma, TrialState.COMPLETE, 6.0)
    assert _plan(sweep, SEARCH, n_trials=2) == ([], 0, 3, 2)


def test_a_search_retries_a_transient_failure_with_its_params_as_a_new_trial(sweep):
    _trial(sweep, 0.9, TrialState.FAIL, fail_reason="no space left on device: x", fail_kind=TRANSIENT)
    _trial(sweep, 1.1, TrialState.FAIL, fail_reason="TrialDiverged", fail_kind=PERMANENT)
    pending, n_new, skipped, _ = _plan(sweep, SEARCH, n_trials=4)
    assert _pending(pending) == [("g0.9", None)]
    assert (n_new, skipped) == (4 - 1 - 1, 1)


def test_a_search_counts_a_failure_once_its_identity_completed_later_not_twice(sweep):
    _trial(sweep, 0.9, TrialState.FAIL, fail_reason="TrialDiverged", fail_kind=PERMANENT)
    _trial(sweep, 0.9, TrialState.COMPLETE, 6.0)
    assert _plan(sweep, SEARCH, n_trials=3)[1:3] == (2, 1)


def test_a_search_counts_a_sampled_point_the_model_rejected_but_not_an_unnamed_running_one(sweep):
    """The searcher records a rejected sample as FAIL without identity; a driver killed between
    Optuna's ask and the attributes leaves an unnamed RUNNING trial, which is neither resumed nor counted."""
    rejected = sweep.study.ask(DISTS)
    sweep.study.finish(rejected, TrialState.FAIL, reason="ConfigError: init.gamma")
    sweep.study.ask(DISTS)
    assert _plan(sweep, SEARCH, n_trials=3) == ([], 2, 1, 3)


def test_a_search_trial_whose_folder_lost_its_result_trains_again_once(sweep):
    old = _trial(sweep, 0.9, TrialState.COMPLETE, 6.0)
    sweep.study.supersede(old, "its folder is gone")
    twice = _trial(sweep, 1.1, TrialState.COMPLETE, 6.5)
    again = _trial(sweep, 1.1, TrialState.COMPLETE, 6.4)
    sweep.study.supersede(twice, "result.json was damaged")
    sweep.study.supersede(again, "result.json was damaged")
    pending, n_new, skipped, _ = _plan(sweep, SEARCH, n_trials=3)
    assert sorted(_pending(pending)) == [("g0.9", None), ("g1.1", None)]
    assert (n_new, skipped) == (1, 0)
