"""A grid point built from its structure's cached compose (sweeper/config/points.py) is the point
Hydra's full compose gives: the same resolved config, value for value and type for type, the
same saved YAML, the same one-line error; and a grid of 10,000 points shows without a compose
per point."""

from __future__ import annotations

import time

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf

from smallinit.core.errors import ConfigError
from smallinit.sweeper.config.points import PointComposer
from smallinit.sweeper.config.precheck import hydra_error
from smallinit.sweeper.config.space import parse_sweep

from .conftest import CONF, run_cli
from .test_identities import PINNED


def _typed(node):
    """The config with each leaf's type beside it: 1 and 1.0 differ, as they do in an identity."""
    if isinstance(node, dict):
        return {k: _typed(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_typed(v) for v in node]
    return type(node).__name__, node


@pytest.fixture
def hydra_pair():
    """(a PointComposer counting its full composes, Hydra's full compose of the job part)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        calls = []

        def full(overrides):
            calls.append(tuple(overrides))
            return compose("config", overrides=overrides, return_hydra_config=True)

        points = PointComposer(full, lambda path: loader.repository.group_exists(path))
        yield points, calls, lambda overrides: compose("config", overrides=overrides)


def _grid(arguments: list[str]) -> list[list[str]]:
    """Each grid point's overrides, as the sweeper and --show build them (with the experiment's
    hydra.sweeper.params)."""
    experiment = [a for a in arguments if a.startswith("+experiment=")]
    base = compose("config", overrides=experiment, return_hydra_config=True)
    params = base.hydra.sweeper.params
    space = parse_sweep(arguments, OmegaConf.to_container(params) if params is not None else {})
    return [space.overrides_for(p) for p in space.grid()]


def _assert_equivalent(points, full, grid):
    for overrides in grid:
        cfg = full(overrides)
        assert _typed(points.job(overrides)) == _typed(OmegaConf.to_container(cfg, resolve=True)), overrides
        assert OmegaConf.to_yaml(OmegaConf.create(points.job(overrides, resolve=False))) == OmegaConf.to_yaml(cfg)


@pytest.mark.parametrize("arguments, structures", [
    (["+experiment=gate"], 2),  # attn=none,elementwise: a group swept beside values
    (["+experiment=bf16_check"], 1),  # seed swept: ${seed} in init.seed and train.seed
    # model= swept; a value typed int and float; an interpolation given on the command line
    # (composed with the structure) that reaches ${seed} through a swept value.
    (["model=nano,micro", "init.gamma=1,0.5", "train.seed=5,6", "init.seed=${train.seed}"], 2),
])
def test_every_grid_point_is_the_full_compose_with_one_compose_per_structure(hydra_pair, arguments, structures):
    points, calls, full = hydra_pair
    grid = _grid(arguments)
    _assert_equivalent(points, full, grid)
    assert len(calls) == len(set(calls)) == structures < len(grid)


@pytest.mark.slow
def test_every_point_of_a_grid_over_presets_arms_and_seeds_is_the_full_compose(hydra_pair):
    points, calls, full = hydra_pair
    grid = _grid(["+experiment=scaling"])  # model x arm x lr x seed: 36 points, 6 structures
    _assert_equivalent(points, full, grid)
    assert len(calls) == 6


def test_the_pinned_identities_come_out_of_the_cached_compose(hydra_pair):
    from smallinit.trainer.config import trial_config_from_dict

    points, _, _ = hydra_pair
    for overrides, identity in PINNED:
        assert trial_config_from_dict(points.job(list(overrides))).identity() == identity, overrides


@pytest.mark.parametrize("bad, message", [
    ("init.gamma=abc", "init.gamma=abc is invalid: must be a number"),
    ("data.vocab_size=4096", "data.vocab_size=4096 is invalid: data has no key 'vocab_size' (one of "),
])
def test_a_refused_value_is_hydras_own_one_line_error_and_leaves_the_cache_sound(hydra_pair, bad, message):
    points, _, full = hydra_pair
    good = ["data=anchor", "init.gamma=0.5"]
    _assert_equivalent(points, full, [good])  # the structure is cached before the bad value
    overrides = ["data=anchor", bad]
    with pytest.raises(HydraException) as hydra:
        full(overrides)
    with pytest.raises(ConfigError) as e:
        points.job(overrides)
    assert str(e.value) == hydra_error(hydra.value, overrides) and str(e.value).startswith(message)
    _assert_equivalent(points, full, [good, ["data=anchor", "init.gamma=2"]])


def test_show_streams_and_a_refused_later_point_is_one_line(tmp_path, data_cache):
    proc = run_cli(["--show", "-m", "model=nano", "data=bilingual,anchor", "data.vocab_size=4096"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)}, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: data.vocab_size=4096 is invalid: data has no key 'vocab_size'")
    # The first trial was printed as soon as it was built, before the second was refused.
    assert "# identity " in proc.stdout and "# with -m: 2 trial(s), grid" in proc.stdout
    assert len([line for line in proc.stdout.splitlines() if line.startswith("#   ")]) == 1


@pytest.mark.slow
def test_show_lists_a_grid_of_10000_points(tmp_path, data_cache):
    lrs = ",".join(f"{1e-4 * 1.2 ** i:.6g}" for i in range(25))
    args = ["--show", "-m", "model=nano", "init.gamma=0.5,0.75,1.0,1.25", "norm.eps=1e-5,1e-12", f"optim.lr={lrs}",
            "seed=range(0,50)"]
    start = time.monotonic()
    proc = run_cli(args, cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)}, timeout=600)
    print(f"--show of 10,000 points: {time.monotonic() - start:.1f} s")
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#   ")]
    assert len(listed) == len(set(listed)) == 10_000
    assert "# with -m: 10000 trial(s), grid" in proc.stdout
    tail = proc.stdout.rstrip().splitlines()[-2:]  # the cost line, then --show's time estimate
    assert tail[0].startswith("# cost of the sweep: 10000 trials, ") and tail[1].startswith("# estimated time: ")
