"""A sweep folder whose grid grows by a key: its earlier trials never swept that key, and the
results table names each trial's whole setting from its composed config."""

from __future__ import annotations

import pandas as pd
import pytest
from omegaconf import OmegaConf

from smallinit.sweeper.results.results import _fill_unswept_params

from .conftest import sweep


def _trial(sweep_dir, name: str, config: dict) -> str:
    (sweep_dir / "trials" / name / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), sweep_dir / "trials" / name / ".hydra" / "config.yaml")
    return f"trials/{name}"


def test_a_key_a_trial_did_not_sweep_takes_the_value_its_config_gave_it(tmp_path):
    first = _trial(tmp_path, "a", {"model": {"preset": "nano"}, "init": {"gamma": 0.5, "seed": "${seed}"},
                                   "optim": {"lr": 0.003}, "seed": 1})
    grown = _trial(tmp_path, "b", {"model": {"preset": "nano"}, "init": {"gamma": 1.0, "seed": "${seed}"},
                                   "optim": {"lr": 0.001}, "seed": 1})
    # Rows as new_row leaves them: each names the keys its trial swept (the table's config/<key>
    # columns of the other keys are filled from trial.json; here, as for `seed` or a group's
    # choice, only the composed config can give them).
    rows = [{"swept": "init.gamma,init.seed", "config/init.gamma": 0.5, "config/init.seed": 1, "trial_dir": first},
            {"swept": "optim.lr,model", "config/optim.lr": 0.001, "config/model": "nano", "trial_dir": grown},
            {"swept": "init.gamma", "config/init.gamma": 0.5, "trial_dir": "trials/gone"}]  # no folder: cells stay empty
    _fill_unswept_params(rows, tmp_path)
    every = "init.gamma,init.seed,optim.lr,model"  # each row names the folder's swept keys
    assert rows[0] == {"swept": every, "config/init.gamma": 0.5, "config/init.seed": 1, "config/optim.lr": 0.003,
                       "trial_dir": first}
    # A group's choice is not one value of the config: it stays empty. An interpolation resolves.
    assert rows[1] == {"swept": every, "config/optim.lr": 0.001, "config/model": "nano", "config/init.gamma": 1.0,
                       "config/init.seed": 1, "trial_dir": grown}
    assert rows[2] == {"swept": every, "config/init.gamma": 0.5, "trial_dir": "trials/gone"}


@pytest.mark.slow
def test_a_folder_grown_by_a_new_key_ends_with_each_setting_named(tmp_path, data_cache):
    first = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "seed=0,1", "wandb.mode=disabled", "name=grown")
    assert first.returncode == 0, first.stderr[-3000:]
    grown = sweep(tmp_path, data_cache, "optim.lr=1e-3,2e-3", "seed=0,1", "wandb.mode=disabled", "name=grown")
    assert grown.returncode == 0, grown.stderr[-3000:]
    assert "4 trials (0 already done)" in grown.stdout and "best setting: " in grown.stdout
    df = pd.read_parquet(tmp_path / "sweeps" / "grown" / "results.parquet")
    assert len(df) == 8 and df[["config/init.gamma", "config/optim.lr", "config/seed"]].notna().all().all()
    assert set(df["swept"]) == {"init.gamma,seed,optim.lr"} and "lr" not in df and "param.optim.lr" not in df
