"""One schema: the dataclasses hold every setting and its default, conf/ only presets,
experiments and overrides. A trial built in Python is the command line's trial, and the
command line refuses a key the dataclasses lack or a value of the wrong type in one line."""

from __future__ import annotations

import shutil

import pytest

from smallinit.core.errors import ConfigError
from smallinit.data.config import BilingualData
from smallinit.model.config import (
    PRESETS,
    AttnConfig,
    InitConfig,
    ModelConfig,
    ModelPreset,
    NormConfig,
)
from smallinit.sweeper.config.precheck import precheck
from smallinit.trainer.config import (
    OptimConfig,
    TrainConfig,
    TrialArgs,
    TrialConfig,
    trial_config_from_dict,
)

from .conftest import CONF, TINY, error_line, run_cli


def test_the_default_trial_built_in_python_is_the_command_lines(compose):
    cli = trial_config_from_dict(compose(tiny=False))  # python sweep.py
    assert TrialArgs().build() == cli
    # As bench/gpu/gpu_bench.py and a notebook build one: the dataclasses' own defaults.
    direct = TrialConfig(model=ModelConfig(), optim=OptimConfig(), train=TrainConfig(), data=BilingualData(),
                         preset="micro")
    assert direct == cli and direct.identity() == cli.identity()
    assert ModelConfig() == PRESETS["micro"] == ModelConfig.preset("micro")


def test_a_preset_and_an_experiment_built_in_python_are_the_command_lines(compose):
    # conf/experiment/scaling_law.yaml's first trial: micro at width 64 with heads of 32 (the
    # preset's depth, Llama's d_ff for the width), the baseline arm, the WSD budgets.
    cli = trial_config_from_dict(compose("+experiment=scaling_law", "model.d_model=64", "arm=baseline",
                                         "optim.lr=1e-3", "seed=100", tiny=False))
    python = TrialArgs(
        model=ModelPreset("micro", d_model=64, head_dim=32),
        init=InitConfig(gamma=0.5, seed=100), norm=NormConfig(eps=1e-5), attn=AttnConfig(gate="none"),
        optim=OptimConfig(lr=1e-3, schedule="wsd"),
        train=TrainConfig(seed=100, batch_size=8, seq_len=128, budgets=(196608, 393216, 786432), eval_every=64,
                          eval_tokens=8192, per_token_eval_tokens=8192, probe_every=256, ckpt_every=128),
    ).build()
    assert python == cli and python.identity() == cli.identity()
    assert (python.model.n_heads, python.model.d_ff) == (2, 192)


@pytest.mark.parametrize("args, message", [
    (["init.gama=1"], "init.gama=1 is invalid: init has no key 'gama' (one of ['gamma', 'seed', "),
    (["data=anchor", "data.vocab_size=50"], "data.vocab_size=50 is invalid: data has no key 'vocab_size'"),
    (["init.gamma=abc"], "init.gamma=abc is invalid: must be a number"),
    (["train.batch_size=1.5"], "train.batch_size=1.5 is invalid: must be an integer"),
    (["optim.betas=[a,0.95]"], "optim.betas=[a,0.95] is invalid: must be a list of numbers"),
    (["train.budgets=4096"], "train.budgets=4096 is invalid: must be a list of integers or null"),
    (["model.d_model=wide"], "model.d_model=wide is invalid: must be an integer or null"),
    (["ray.cpus_per_trial=many"], "ray.cpus_per_trial=many is invalid: must be a number"),
])
def test_composition_refuses_unknown_keys_and_wrong_types_in_one_line(args, message):
    with pytest.raises(ConfigError) as e:
        precheck(args, CONF)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("args, show, command", [
    (["init.gamma=0.5,1.0"], False, "python sweep.py -m init.gamma=0.5,1.0"),
    (["model=nano", "train.seed=range(0,3)"], False, "python sweep.py -m model=nano 'train.seed=range(0,3)'"),
    (["init.gamma=interval(0.25,1.5)"], True, "python sweep.py --show -m 'init.gamma=interval(0.25,1.5)'"),
])
def test_a_sweep_without_m_is_one_line_showing_the_m_form(args, show, command):
    with pytest.raises(ConfigError) as e:
        precheck(args, CONF, show=show)
    assert str(e.value) == f"{args[-1]} is a sweep: run it with -m, e.g. {command}"
    precheck(["-m", *args], CONF)  # the command it shows passes
    precheck(["optim.betas=[0.9,0.95]"], CONF)  # a list value is no sweep


def test_a_sweep_without_m_on_the_command_line_is_hydras_habit_in_one_line(tmp_path):
    proc = run_cli(["init.gamma=0.5,1.0"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 1 and not (tmp_path / "runs").exists()
    assert error_line(proc) == ("error: init.gamma=0.5,1.0 is a sweep: run it with -m, "
                                "e.g. python sweep.py -m init.gamma=0.5,1.0")


def test_a_wrong_type_in_a_conf_file_is_refused_naming_the_key(tmp_path):
    conf = shutil.copytree(CONF, tmp_path / "conf")
    (conf / "experiment" / "typo.yaml").write_text("# @package _global_\ninit:\n  gamma: one\n")
    with pytest.raises(ConfigError, match=r"^init\.gamma='one' is invalid: must be a number$"):
        precheck(["+experiment=typo"], conf)
    (conf / "experiment" / "typo.yaml").write_text("# @package _global_\ntrain:\n  eval_evry: 10\n")
    with pytest.raises(ConfigError, match=r"^train\.eval_evry is invalid: train has no key 'eval_evry' \(one of "):
        precheck(["+experiment=typo"], conf)


def test_model_ffn_is_a_mapping_of_its_keys(trial_config):
    assert trial_config("model.ffn={type: moe, n_experts: 4, top_k: 1}").model.ffn.n_experts == 4
    with pytest.raises(ConfigError, match=r"^model\.ffn=\{'kind': 'moe'\} is invalid: null \(the preset's\) or a mapping"):
        trial_config("model.ffn={kind: moe}")


def test_a_wrong_type_in_a_later_grid_point_is_one_line(tmp_path, data_cache):
    proc = run_cli(["-m", *TINY, "init.gamma=0.5,abc", "name=typed"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)}, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "error: init.gamma=abc is invalid: must be a number", proc.stderr[-2000:]
    assert not (tmp_path / "sweeps" / "typed" / "trials").exists()
