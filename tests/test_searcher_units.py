"""The Tune searcher over the study (sweeper/study/searcher.py), driven by hand as Tune drives it:
which trial each suggest hands out and how each ending is recorded, on a real SQLite study.
No Ray runtime starts; importing ray.tune for the Searcher base class takes a few seconds."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher

from smallinit.core.errors import ConfigError
from smallinit.sweeper.config.space import parse_sweep
from smallinit.sweeper.config.spec import TrialSpec
from smallinit.sweeper.study.searcher import StudySearcher
from smallinit.sweeper.study.study import SAMPLED, Pending, Study, default_storage_url, open_storage
from smallinit.sweeper.worker.failures import PERMANENT, TRANSIENT, WORKER_CRASHED
from smallinit.sweeper.worker.trainable import METRIC

SEARCH = parse_sweep(["init.gamma=interval(0.5,1.25)"])
DISTS = {"init.gamma": FloatDistribution(0.5, 1.25)}


@pytest.fixture
def study(study_folder):
    return Study(open_storage(default_storage_url(study_folder)), "s", optuna.samplers.RandomSampler(seed=0))


def _spec(tmp_path, gamma: float, role: str | None = None) -> TrialSpec:
    identity = f"g{gamma}"
    return TrialSpec(identity=identity, trial=None, out_dir=str(tmp_path / "trials" / identity),
                     params={"init.gamma": gamma}, overrides=[f"init.gamma={gamma}"], sweep_name="s", role=role)


def _searcher(study, pending=(), n_new=0, build=None, max_failure_rate=0.5) -> StudySearcher:
    return StudySearcher(study, SEARCH, list(pending), n_new, build or (lambda params: None), max_failure_rate,
                         grid_distributions=DISTS)


def _trials(study) -> list:
    return study.study.get_trials(deepcopy=True)


def test_a_pending_point_becomes_one_named_running_trial(study, tmp_path):
    searcher = _searcher(study, [Pending(_spec(tmp_path, 0.75, role="tune"))])
    config = searcher.suggest("t1")
    (t,) = _trials(study)
    assert (config["identity"], config["number"], config["init.gamma"]) == ("g0.75", t.number, 0.75)
    assert (t.state, t.params) == (TrialState.RUNNING, {"init.gamma": 0.75})
    assert t.user_attrs == {"identity": "g0.75", "trial_dir": "trials/g0.75", "role": "tune", SAMPLED: False}
    assert searcher.suggest("t2") == Searcher.FINISHED


def test_a_trial_left_running_is_handed_out_again_not_duplicated(study, tmp_path):
    left = study.create_running({"init.gamma": 1.0}, DISTS, identity="g1.0", trial_dir="/old/place/g1.0")
    searcher = _searcher(study, [Pending(_spec(tmp_path, 1.0), existing=left)])
    assert searcher.suggest("t1")["number"] == left.number
    (t,) = _trials(study)
    assert t.user_attrs["trial_dir"] == "trials/g1.0"  # renamed to where this sweep trains it


def test_new_samples_are_asked_after_the_pending_ones_and_named(study, tmp_path):
    searcher = _searcher(study, [Pending(_spec(tmp_path, 0.5))], n_new=1,
                         build=lambda params: _spec(tmp_path, round(params["init.gamma"], 3)))
    assert searcher.suggest("t1")["init.gamma"] == 0.5
    sampled = searcher.suggest("t2")
    assert searcher.suggest("t3") == Searcher.FINISHED
    first, second = _trials(study)
    assert (first.user_attrs[SAMPLED], second.user_attrs[SAMPLED]) == (False, True)
    assert second.user_attrs["identity"] == sampled["identity"] == f"g{round(second.params['init.gamma'], 3)}"


def test_a_sample_the_model_rejects_is_recorded_failed_and_the_next_is_asked(study, tmp_path):
    calls = []

    def build(params):
        calls.append(params)
        if len(calls) == 1:
            raise ConfigError("init.gamma=0.6 is invalid: rejected for this test")
        return _spec(tmp_path, 0.9)

    searcher = _searcher(study, n_new=2, build=build)
    assert searcher.suggest("t1")["identity"] == "g0.9"
    rejected, kept = _trials(study)
    assert rejected.state == TrialState.FAIL
    assert rejected.user_attrs["fail_reason"] == "init.gamma=0.6 is invalid: rejected for this test"
    assert "identity" not in rejected.user_attrs
    assert (kept.state, searcher.counts["failed"]) == (TrialState.RUNNING, 1)


@pytest.mark.parametrize(("error", "result", "state", "value", "attrs"), [
    (False, {METRIC: 6.25, "done_training": True}, TrialState.COMPLETE, 6.25, {}),
    (False, {METRIC: 7.0, "done_training": False}, TrialState.PRUNED, None, {}),
    (False, {"failed": True, "fail_reason": "TrialDiverged: nan", "fail_kind": PERMANENT}, TrialState.FAIL, None,
     {"fail_reason": "TrialDiverged: nan", "fail_kind": PERMANENT}),
    (True, None, TrialState.FAIL, None, {"fail_reason": WORKER_CRASHED, "fail_kind": TRANSIENT}),
    (False, {"done_training": True}, TrialState.FAIL, None, {"fail_reason": "no finite validation loss"}),
])
def test_each_ending_is_recorded_once_as_tune_reports_it(study, tmp_path, error, result, state, value, attrs):
    searcher = _searcher(study, [Pending(_spec(tmp_path, 0.5))])
    searcher.suggest("t1")
    searcher.on_trial_complete("t1", result, error=error)
    searcher.on_trial_complete("t1", {METRIC: 1.0, "done_training": True})  # Tune's trial id is spent
    (t,) = _trials(study)
    assert (t.state, t.value) == (state, value)
    assert {k: t.user_attrs.get(k) for k in attrs} == attrs
    assert sum(searcher.counts.values()) == 1


def test_each_ending_is_followed_by_the_table_rewrite_which_sees_it_and_cannot_stop_the_sweep(study, tmp_path, caplog):
    seen = []

    def rewrite():  # the driver's refresh_table: it reads the study after the ending is recorded
        seen.append([t.state for t in _trials(study)])
        if len(seen) == 2:
            raise OSError("disk full")

    searcher = StudySearcher(study, SEARCH, [Pending(_spec(tmp_path, g)) for g in (0.5, 0.6)], 0, lambda p: None,
                             0.5, grid_distributions=DISTS, on_trial_ended=rewrite)
    searcher.suggest("a")
    searcher.suggest("b")
    searcher.on_trial_result("a", {METRIC: 7.0, "step": 4})
    assert seen == []  # a report is not an ending
    searcher.on_trial_complete("a", {METRIC: 6.5, "done_training": True})
    assert seen == [[TrialState.COMPLETE, TrialState.RUNNING]]
    searcher.on_trial_complete("b", {"failed": True, "fail_reason": "x"})  # its rewrite fails: logged, not raised
    assert seen[1] == [TrialState.COMPLETE, TrialState.FAIL]
    assert "results table not rewritten after trial 1 ended: disk full" in caplog.text
    assert searcher.counts == {"complete": 1, "pruned": 0, "failed": 1}


def test_the_table_is_rewritten_as_trials_end_but_never_more_than_a_tenth_of_the_time(monkeypatch):
    from smallinit.sweeper.results import results

    clock, rewrites = [0.0], []

    def rewrite(sweep_dir, study):  # each rebuild takes 2 s of the driver's time
        rewrites.append(clock[0])
        clock[0] += 2.0

    monkeypatch.setattr(results, "refresh_table", rewrite)
    refresher = results.TableRefresher(None, None, clock=lambda: clock[0])
    for at in (0.0, 1.0, 19.0, 20.5, 40.0):  # trials ending at these times
        clock[0] = max(clock[0], at)
        refresher()
    assert rewrites == [0.0, 20.5]  # after one at 0-2 s, none until 2 + 9 x 2 = 20 s; then none until 40.5


def test_intermediate_results_are_reported_by_step(study, tmp_path):
    searcher = _searcher(study, [Pending(_spec(tmp_path, 0.5))])
    searcher.suggest("t1")
    for result in ({METRIC: 7.5, "step": 4}, {METRIC: 7.0}, {"step": 8}, {METRIC: 6.75, "step": 12}):
        searcher.on_trial_result("t1", result)
    searcher.on_trial_result("unknown", {METRIC: 1.0, "step": 4})
    assert _trials(study)[0].intermediate_values == {4: 7.5, 12: 6.75}


def test_the_sweep_stops_handing_out_trials_once_failures_pass_the_rate(study, tmp_path):
    points = [Pending(_spec(tmp_path, g)) for g in (0.5, 0.6, 0.7, 0.8, 0.9)]
    searcher = _searcher(study, points, max_failure_rate=0.5)
    for tid in ("a", "b"):  # two failures of two: too few ended to judge
        searcher.suggest(tid)
        searcher.on_trial_complete(tid, {"failed": True, "fail_reason": "x"})
    assert searcher.aborted is None
    searcher.suggest("c")
    searcher.on_trial_complete("c", {METRIC: 6.0, "done_training": True})
    assert searcher.aborted == ("2 of 3 trials failed, above hydra.sweeper.max_failure_rate=0.5: the sweep was "
                                "stopped (see the fail_reason column of results.parquet)")
    assert searcher.suggest("d") == Searcher.FINISHED
    assert len(_trials(study)) == 3


def test_a_failure_rate_at_the_limit_does_not_stop_the_sweep(study, tmp_path):
    searcher = _searcher(study, [Pending(_spec(tmp_path, g)) for g in (0.5, 0.6, 0.7, 0.8)], max_failure_rate=0.5)
    done = {METRIC: 6.0, "done_training": True}
    for tid, result in zip("abcd", [done, {"failed": True}, done, {"failed": True}], strict=True):  # 1/3, then 2/4
        searcher.suggest(tid)
        searcher.on_trial_complete(tid, result)
    assert (searcher.aborted, searcher.counts) == (None, {"complete": 2, "pruned": 0, "failed": 2})
