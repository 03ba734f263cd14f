"""Override grammar -> sweep space, table-driven like Hydra's Optuna plugin tests."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from smallinit.model import ConfigError
from smallinit.sweeper.config.space import parse_sweep


@pytest.mark.parametrize(
    "override, key, values",
    [
        ("init.gamma=0.5,1.0", "init.gamma", (0.5, 1.0)),
        ("norm.eps=1e-5,1e-12", "norm.eps", (1e-5, 1e-12)),
        ("attn=none,headwise,elementwise", "attn", ("none", "headwise", "elementwise")),
        ("model=nano,micro", "model", ("nano", "micro")),
        ("train.seed=range(0,3)", "train.seed", (0, 1, 2)),
        ("init.gamma=range(0.5,1.5,0.5)", "init.gamma", (0.5, 1.0)),
        ("init.gamma=choice(0.5,0.75)", "init.gamma", (0.5, 0.75)),
        ("init.seed=1,2", "init.seed", (1, 2)),
    ],
)
def test_discrete_sweeps_form_a_grid(override, key, values):
    space = parse_sweep([override])
    assert space.mode == "grid"
    assert space.discrete[key].values == values
    assert [p[key] for p in space.grid()] == list(values)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("init.gamma=interval(0.25,1.5)", FloatDistribution(0.25, 1.5)),
        ("optim.lr=tag(log,interval(1e-4,1e-2))", FloatDistribution(1e-4, 1e-2, log=True)),
        ("optim.warmup_frac=interval(0,1)", FloatDistribution(0.0, 1.0)),
        ("train.seed=tag(int,interval(0.0,10.0))", IntDistribution(0, 10)),
    ],
)
def test_intervals_form_an_optuna_space(override, expected):
    space = parse_sweep([override])
    assert space.mode == "search"
    assert list(space.distributions().values()) == [expected]


def test_grid_is_the_cartesian_product_in_command_line_order():
    space = parse_sweep(["init.gamma=0.5,0.75,1.0,1.25", "norm.eps=1e-5,1e-12", "model=micro"])
    grid = space.grid()
    assert len(grid) == 8 and space.fixed == ["model=micro"]
    assert grid[0] == {"init.gamma": 0.5, "norm.eps": 1e-5} and grid[1] == {"init.gamma": 0.5, "norm.eps": 1e-12}
    assert space.overrides_for(grid[3]) == ["model=micro", "init.gamma=0.75", "norm.eps=1e-12"]


def test_discrete_sweeps_become_categoricals_in_a_search():
    space = parse_sweep(["attn=none,headwise", "init.gamma=interval(0.5,1.5)"])
    dists = space.distributions()
    assert dists["attn"] == CategoricalDistribution(["none", "headwise"])
    assert isinstance(dists["init.gamma"], FloatDistribution)


def test_params_from_config_work_like_the_command_line_which_wins():
    space = parse_sweep(["init.gamma=0.5,1.0"], params={"init.gamma": "0.1,0.2,0.3", "norm.eps": "1e-5,1e-12"})
    assert space.discrete["init.gamma"].values == (0.5, 1.0)
    assert space.discrete["norm.eps"].values == (1e-5, 1e-12)


@pytest.mark.parametrize(
    "override, message",
    [
        ("init.gamma=interval(1)", "init.gamma=interval(1) is invalid"),
        ("init.gamma=interval(2,1)", "needs start < end"),
        ("optim.lr=tag(log,interval(0,1))", "log interval needs start > 0"),
        ("init.gamma=range(1,1)", "has no values"),
        ("init.gamma=0.5,0.5", "lists a value twice"),
        ("seed=range(0,100000000)", "the grid seed (100,000,000) has 100,000,000 points, more than a sweep may hold"),
        ("init.gamma=(0.5", "init.gamma=(0.5 is invalid"),
    ],
)
def test_malformed_sweeps_fail_with_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_sweep([override])


def test_a_swept_key_given_twice_is_refused_not_dropped_and_a_plain_one_keeps_hydras_last_wins():
    with pytest.raises(ConfigError, match=r"^init.gamma is given twice \(init.gamma=0.5,1.0 and init.gamma=0.75\): "
                                          r"give a swept key once, with all its values$"):
        parse_sweep(["init.gamma=0.5,1.0", "init.gamma=0.75"])
    assert parse_sweep(["train.max_tokens=1024", "train.max_tokens=4096"]).fixed == ["train.max_tokens=1024", "train.max_tokens=4096"]


def test_a_grid_past_the_limit_is_refused_with_its_size_before_it_is_expanded():
    with pytest.raises(ConfigError, match=r"^the grid seed \(10,000\) x init.gamma \(10,000\) has 100,000,000 points, more than a sweep may hold \(100,000\)"):
        parse_sweep(["seed=range(0,10000)", "init.gamma=range(0,10000)"])


def test_grid_matches_hydras_batched_sweeper_suite():
    """The expectations of hydra.test_utils.launcher_common_tests.BatchedSweeperTestSuite
    (same overrides, same composed configs, same order), on Hydra's own test app. The suite
    itself drives a task function through a launcher; our sweeper runs training trials on
    Ray Tune instead, so the suite's batch and return-value checks do not apply."""
    from pathlib import Path

    import hydra.test_utils
    from hydra import compose, initialize_config_dir

    space = parse_sweep(["group1=file1,file2", "bar=100,200,300"])
    got = [space.overrides_for(p) for p in space.grid()]
    assert got == [[f"group1=file{g}", f"bar={b}"] for g in (1, 2) for b in (100, 200, 300)]
    configs = Path(hydra.test_utils.__file__).parent / "configs"
    confs = []
    for overrides in got:
        with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
            cfg = compose("compose", overrides=overrides)
        confs.append({"foo": cfg.foo, "bar": cfg.bar})
    assert confs == [{"foo": f, "bar": b} for f in (10, 20) for b in (100, 200, 300)]


def test_a_grid_is_recorded_so_that_it_can_grow_and_a_categorical_cannot():
    import optuna

    from smallinit.sweeper.study.study import Study

    study = Study(optuna.storages.InMemoryStorage(), "grow", optuna.samplers.RandomSampler(seed=0))
    small = parse_sweep(["seed=0,1,2", "attn=none,headwise"])
    dists = study.grid_distributions(small)
    assert isinstance(dists["seed"], optuna.distributions.IntDistribution)
    for point in small.grid():
        study.create_running(point, dists)
    grown = parse_sweep(["seed=0,1,2,3,4,5", "attn=none"])
    again = study.grid_distributions(grown)
    for point in grown.grid():  # Optuna accepts every new record
        study.create_running(point, again)
    wider = parse_sweep(["seed=0", "attn=none,elementwise"])
    with pytest.raises(ConfigError, match=r"attn is invalid for study 'grow'.*cannot widen a categorical"):
        study.grid_distributions(wider)


def test_a_study_that_recorded_numbers_as_choices_still_reruns_its_grid():
    """Studies written before grids were recorded as ranges hold seeds and gammas as
    categoricals: the same grid, or a part of it, must still run on them."""
    import optuna

    from smallinit.sweeper.study.study import Study

    study = Study(optuna.storages.InMemoryStorage(), "old", optuna.samplers.RandomSampler(seed=0))
    old = parse_sweep(["seed=0,1,2", "init.gamma=0.5,1.0"])
    for point in old.grid():
        study.create_running(point, old.distributions())  # categoricals, as the old code recorded
    again = study.grid_distributions(old)
    assert again == old.distributions()
    study.grid_distributions(parse_sweep(["seed=0,1", "init.gamma=1.0"]))  # a subset runs too
    with pytest.raises(ConfigError, match=r"seed is invalid for study 'old'.*cannot widen a categorical"):
        study.grid_distributions(parse_sweep(["seed=0,1,2,3", "init.gamma=0.5,1.0"]))


def test_grid_values_a_decade_apart_are_recorded_on_a_log_axis_and_old_linear_studies_still_grow():
    import optuna

    from smallinit.sweeper.study.study import Study

    space = parse_sweep(["norm.eps=1e-5,1e-12", "optim.lr=1e-3,3e-3,1e-2", "init.gamma=0.5,1.0", "optim.weight_decay=0,0.1"])
    dists = space.grid_distributions()
    assert dists["norm.eps"].log and dists["optim.lr"].log
    assert not dists["init.gamma"].log  # a factor of 2: linear
    assert not dists["optim.weight_decay"].log  # 0 has no logarithm

    study = Study(optuna.storages.InMemoryStorage(), "linear", optuna.samplers.RandomSampler(seed=0))
    old = parse_sweep(["norm.eps=1e-5,1e-12"])
    for point in old.grid():  # as studies before log axes recorded it
        study.create_running(point, {"norm.eps": optuna.distributions.FloatDistribution(1e-12, 1e-5)})
    grown = parse_sweep(["norm.eps=1e-5,1e-8,1e-12,1e-3"])
    again = study.grid_distributions(grown)
    assert not again["norm.eps"].log
    for point in grown.grid():  # Optuna accepts every new record on the recorded scale
        study.create_running(point, again)


def test_make_sweep_lets_a_key_in_args_replace_the_grids_own():
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(["make", "-n", "-s", "sweep", "ARGS=init.gamma=1.0 train.max_tokens=4096", "STAMP=Makefile"],
                         cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    args = out[out.index("-m") + 1:]
    assert [a for a in args if a.startswith("init.gamma=")] == ["init.gamma=1.0"]
    assert "norm.eps=1e-5,1e-12" in args and "train.max_tokens=4096" in args
    parse_sweep(args)  # and the sweep takes it
