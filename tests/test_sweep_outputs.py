"""What a sweep leaves for other tools to read: Tune's dataframes with a column per swept key,
an Optuna study whose trial folders are relative to the sweep folder (so the folder can move),
and a `--help` that lists only what a user can choose."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings

import optuna
import pandas as pd
from optuna.distributions import FloatDistribution

from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.study.study import Study

from .conftest import CONF, REPO


def test_tune_dataframes_have_config_columns_and_the_study_paths_move_with_the_folder(tiny_sweep, tmp_path):
    results = pd.read_parquet(tiny_sweep / "results.parquet")
    swept = ["config/init.gamma", "config/norm.eps", "config/train.seed"]

    from ray.tune import ExperimentAnalysis, ResultGrid

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = ExperimentAnalysis(str(tiny_sweep / "ray" / "tune"))
        frames = [analysis.dataframe(), ResultGrid(analysis).get_dataframe()]
    for df in frames:
        assert {*swept, "config/identity", "config/spec"} <= set(df.columns)  # Tune's names are the table's
        got = df.set_index("config/identity")[swept].sort_index()
        want = results.set_index("identity")[swept].sort_index()
        assert len(got) == 8 and (got.to_numpy() == want.to_numpy()).all()

    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{tiny_sweep / 'optuna.db'}")
    recorded = {t.user_attrs["identity"]: t.user_attrs["trial_dir"] for t in study.get_trials()}
    assert recorded == dict(zip(results["identity"], results["trial_dir"]))  # the parquet's relative paths
    assert all(path == f"trials/{ident}" for ident, path in recorded.items())
    # A grid's values are recorded as ranges (docs/sweeps.md: so the grid can grow); the trials say
    # they were fixed points, not samples, which is how the report knows to skip importances.
    assert {type(d).__name__ for t in study.get_trials() for d in t.distributions.values()} == {"FloatDistribution",
                                                                                              "IntDistribution"}
    assert [t.user_attrs["sampled"] for t in study.get_trials()] == [False] * 8

    # Copied elsewhere, the folder's study still finds each trial's folder.
    moved = tmp_path / "elsewhere" / "rep"
    shutil.copytree(tiny_sweep, moved)
    storage = optuna.storages.RDBStorage(f"sqlite:///{moved / 'optuna.db'}")
    found = {i: TrialDir(t.user_attrs["trial_dir"]) for i, t in
             Study(storage, "rep", optuna.samplers.RandomSampler()).by_identity().items()}
    assert len(found) == 8 and all(d.path == moved / "trials" / i and d.finished for i, d in found.items())


def test_a_study_reads_relative_paths_and_the_absolute_ones_older_studies_wrote(tmp_path):
    old_place, sweep_dir = tmp_path / "cluster" / "s", tmp_path / "laptop" / "s"
    for ident in ("new", "old"):
        TrialDir.in_sweep(sweep_dir, ident).path.mkdir(parents=True)
    study = Study(optuna.storages.RDBStorage(f"sqlite:///{sweep_dir / 'optuna.db'}"), "s", optuna.samplers.RandomSampler())
    dists = {"init.gamma": FloatDistribution(0.5, 1.0)}
    # A grid point is created with its attributes in one write (a kill between two would leave
    # a trial no rerun can match), its folder stored relative like set_attrs stores it.
    study.create_running({"init.gamma": 0.5}, dists, identity="new", trial_dir=str(sweep_dir / "trials" / "new"))
    t = study.create_running({"init.gamma": 0.5}, dists, identity="old")
    # written before paths were relative, on the machine the folder came from
    study.storage.set_trial_user_attr(t._trial_id, "trial_dir", str(old_place / "trials" / "old"))
    assert {t.user_attrs["sampled"] for t in study.study.get_trials()} == {False}
    assert study.ask(dists).user_attrs["sampled"] is True  # chosen by the sampler, unlike the two above
    raw = {t.user_attrs["identity"]: t.user_attrs["trial_dir"] for t in study.study.get_trials() if "identity" in t.user_attrs}
    assert raw == {"new": "trials/new", "old": str(old_place / "trials" / "old")}
    local = {i: t.user_attrs["trial_dir"] for i, t in study.by_identity().items()}
    assert local == {"new": str(sweep_dir / "trials" / "new"), "old": str(sweep_dir / "trials" / "old")}
    # A storage elsewhere (a shared database) keeps the absolute path: no folder to be relative to.
    other = Study(optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'shared.db'}"), "x", optuna.samplers.RandomSampler())
    assert other.stored_path(sweep_dir / "trials" / "new") == "laptop/s/trials/new"
    assert other.stored_path(tmp_path.parent / "t") == str((tmp_path.parent / "t").resolve())


def test_help_lists_only_the_presets_a_user_can_choose():
    proc = subprocess.run([sys.executable, str(REPO / "sweep.py"), "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    groups = dict(re.findall(r"^([\w/]+): (.+)$", proc.stdout.split("== Config ==")[0], re.M))
    options = {g: v.split(", ") for g, v in groups.items()}
    assert {"model", "experiment", "experiment/gpu"} <= set(options)
    assert [o for opts in options.values() for o in opts if o.startswith("_")] == []
    # Every preset file of the folders is an option, nothing else is.
    for group in ("model", "experiment/gpu"):
        assert sorted(options[group]) == sorted(p.stem for p in (CONF / group).glob("*.yaml"))
