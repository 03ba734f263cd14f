"""Settings that compose but cannot train meaningfully are refused before launch, in one line
naming the key, the value and what is allowed: an init std that underflows the weights' dtype,
a seed the stack cannot hold, a fixed key swept past the folder's question."""

from __future__ import annotations

import json
import math

import pytest

from smallinit.core.errors import ConfigError
from smallinit.model.config import SMALLEST_NORMAL, FFNConfig, InitConfig, ModelConfig
from smallinit.sweeper.config import fixed_overrides

from .conftest import TINY, run_cli, sweep

NANO = ModelConfig.preset("nano")


@pytest.mark.parametrize("cfg", [
    NANO,
    NANO.replace(tie_embeddings=False, d_ff=200),
    NANO.replace(ffn=FFNConfig(type="moe", n_experts=2, top_k=1, d_expert=96)),
], ids=["nano", "untied", "moe"])
def test_init_fan_ins_are_the_largest_each_group_of_the_built_model_draws(cfg, monkeypatch):
    from smallinit.model import init
    from smallinit.model.transformer import Transformer

    drawn: dict = {}
    real = init.Initializer.normal

    def record(self, name, param, fan_in, group=None):
        drawn[group] = max(drawn.get(group, 0), fan_in)
        return real(self, name, param, fan_in, group)

    monkeypatch.setattr(init.Initializer, "normal", record)
    Transformer(cfg)
    assert drawn == cfg.init_fan_ins()


def test_an_init_std_below_the_smallest_normal_is_refused_and_the_bound_is_exact():
    widest = max(NANO.init_fan_ins().values())  # 384 (d_ff) for nano
    bound = math.log(1 / SMALLEST_NORMAL) / math.log(widest)
    NANO.replace(init=InitConfig(gamma=bound * (1 - 1e-9)))  # std just above 2^-126: trains
    with pytest.raises(ConfigError, match=r"^init\.gamma=1000000000\.0 is invalid: std = 384\^-1e\+09 = 0 underflows "):
        NANO.replace(init=InitConfig(gamma=1e9))
    with pytest.raises(ConfigError, match=r"^init\.mlp_out_gamma=15\.0 is invalid: .* gamma must be <= 14\.67$"):
        NANO.replace(init=InitConfig(mlp_out_gamma=15.0))
    NANO.replace(init=InitConfig(embedding_gamma=15.0))  # 128^-15 = 2^-105: a normal float32


def test_a_train_seed_past_2_to_the_32_is_refused(trial_config):
    assert trial_config(f"train.seed={2**32 - 1}").train.seed == 2**32 - 1
    with pytest.raises(ConfigError, match=r"^train\.seed=99999999999999999999 is invalid: must be an integer in \[0, 2\^32\)$"):
        trial_config("train.seed=99999999999999999999")


@pytest.mark.parametrize("arg, message", [
    ("init.gamma=0.5,1e9", "error: init.gamma=1000000000.0 is invalid: std = 384^-1e+09 = 0 underflows"),
    ("train.seed=0,99999999999999999999", "error: train.seed=99999999999999999999 is invalid: must be an integer"),
    ("init.gamma=1,1.0", "error: init.gamma=1,1.0 is invalid: init.gamma lists 1 and 1.0, one value; give it once"),
    ("wandb.project=../../x", "error: wandb.project=../../x is invalid: must be 1-128 characters without / \\ # ? % : (found /)"),
    ("hydra.sweep.dir=", "error: hydra.sweep.dir='' is invalid: name the sweep's folder"),
])
def test_a_degenerate_grid_point_is_refused_before_anything_is_written(tmp_path, data_cache, arg, message):
    proc = run_cli(["-m", *[t for t in TINY if not t.startswith("wandb.")], arg, "name=degenerate"], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "sweeps").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == []  # nothing written here


def test_a_fixed_key_swept_without_its_value_is_another_question(tmp_path):
    record = {"fixed": {"train.max_tokens": "train.max_tokens=1024", "optim.lr": "optim.lr=1e-3"}, "swept": []}
    (tmp_path / fixed_overrides.RECORD).write_text(json.dumps(record))
    fixed = ["train.max_tokens=1024", "optim.lr=1e-3"]
    with pytest.raises(ConfigError, match=r"^train\.max_tokens=2048,4096 is invalid in .*: it was made with "
                                          r"train\.max_tokens=1024, and a sweep of train\.max_tokens without 1024"):
        fixed_overrides.check(tmp_path, ["optim.lr=1e-3"], ["train.max_tokens"], {"train.max_tokens": ("2048", "4096")})
    with pytest.raises(ConfigError, match=r"^optim\.lr as an interval is invalid"):
        fixed_overrides.check(tmp_path, ["train.max_tokens=1024"], ["optim.lr"])
    # Grown around the folder's value (written another way, too): the old trials are a slice of it.
    grown = fixed_overrides.check(tmp_path, ["train.max_tokens=1024"], ["optim.lr"], {"optim.lr": ("0.001", "0.002")})
    assert grown == {"fixed": record["fixed"], "swept": ["optim.lr"]}
    assert fixed_overrides.check(tmp_path, fixed, [], {}) == record  # the same command: resumes
    # Where and how a trial runs is not another question: a folder carried between machines
    # (records/keep.py) resumes with train.keep_weights=false added.
    assert fixed_overrides.check(tmp_path, [*fixed, "train.keep_weights=false"], [], {}) == record


@pytest.mark.slow
def test_a_folder_made_at_one_budget_refuses_a_grid_of_others(tmp_path, data_cache):
    first = sweep(tmp_path, data_cache, "init.gamma=1.0", "wandb.mode=disabled", "name=budget")
    assert first.returncode == 0, first.stderr[-3000:]
    record = tmp_path / "sweeps" / "budget" / fixed_overrides.RECORD
    before = record.read_text()
    again = sweep(tmp_path, data_cache, "init.gamma=1.0", "train.max_tokens=2048,4096", "wandb.mode=disabled",
                  "name=budget")
    assert again.returncode == 1 and len(again.stderr.strip().splitlines()) == 1, again.stderr[-2000:]
    assert again.stderr.startswith("error: train.max_tokens=2048,4096 is invalid in ")
    assert "made with train.max_tokens=1024" in again.stderr and record.read_text() == before
    assert len(list((tmp_path / "sweeps" / "budget" / "trials").iterdir())) == 1  # nothing planned
    # The same budget question asked through another key: max_steps wins over max_tokens.
    steps = sweep(tmp_path, data_cache, "init.gamma=1.0", "train.max_steps=16,32", "wandb.mode=disabled", "name=budget")
    assert steps.returncode == 1 and steps.stderr.startswith("error: train.max_steps=16,32 is invalid in ")
    assert "made at train.max_tokens=1024" in steps.stderr and record.read_text() == before


def test_a_damaged_folder_record_is_one_line_not_a_guess(tmp_path):
    (tmp_path / fixed_overrides.RECORD).write_text("{bad")
    with pytest.raises(ConfigError, match=r"fixed_overrides.json is unreadable \(Expecting property name.*restore it"):
        fixed_overrides.check(tmp_path, ["train.max_tokens=1024"], [], {})
    (tmp_path / fixed_overrides.RECORD).write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds a list without a 'fixed' mapping"):
        fixed_overrides.check(tmp_path, [], [], {})
