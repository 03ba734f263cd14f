"""One name per value in the results table (core/results_schema.py): every setting is
`config/<the key a user types>`, and tables written under the earlier names (`param.<key>`, the
short `gamma`/`lr`/... columns, `config/model.init.gamma`) read as today's through one rename map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smallinit.core import results_schema as schema

REPO = Path(__file__).resolve().parents[1]
# A committed table written before the rename: the 4M WSD whole runs (results.csv's twin).
OLD_TABLE = REPO / "docs" / "results" / "crossover_whole" / "results-whole_wsd_4m.csv"


def test_a_committed_table_of_the_old_names_reads_with_each_value_once_under_its_key():
    old = pd.read_csv(OLD_TABLE)
    assert {"param.arm", "param.optim.lr", "param.seed", "gamma", "lr", "config/model.init.gamma"} <= set(old.columns)
    new = schema.upgrade(old)
    assert not [c for c in new.columns if c.startswith("param.")]
    assert not set(schema.SHORT_NAMES) & set(new.columns)
    assert not {"config/model.init.gamma", "config/model.norm.eps", "config/model.attn.gate", "config/preset"} & set(new.columns)
    assert new.columns.is_unique and len(new) == len(old)
    assert schema.swept_keys(new) == ["arm", "optim.lr", "seed"]
    for old_name, name in [("param.arm", "config/arm"), ("param.seed", "config/seed"), ("gamma", "config/init.gamma"),
                           ("config/model.init.gamma", "config/init.gamma"), ("eps", "config/norm.eps"),
                           ("gate", "config/attn.gate"), ("lr", "config/optim.lr"), ("param.optim.lr", "config/optim.lr"),
                           ("train_seed", "config/train.seed"), ("model", "config/model.preset"),
                           ("d_model", "config/model.d_model"), ("final_val_loss", "final_val_loss")]:
        assert new[name].astype(str).tolist() == old[old_name].astype(str).tolist(), (old_name, name)
    # The analysis names the compared settings as its code does, each once.
    short = schema.analysis_names(new)
    assert {"gamma", "lr", "eps", "train_seed", "config/arm"} <= set(short.columns) and short.columns.is_unique
    assert schema.analysis_column("init.gamma") == "gamma" and schema.analysis_column("arm") == "config/arm"


def test_where_names_held_one_value_the_trials_own_config_comes_first_and_the_rest_fill_gaps():
    old = pd.DataFrame({"identity": ["a", "b"], "role": [None, None], "param.optim.lr": [np.nan, 0.02],
                        "lr": [0.003, 0.02], "config/optim.lr": [0.003, np.nan]})
    new = schema.upgrade(old)
    assert list(new.columns) == ["identity", "role", "swept", "config/optim.lr"]
    assert new["config/optim.lr"].tolist() == [0.003, 0.02] and new["swept"].tolist() == ["optim.lr"] * 2


def test_todays_table_passes_unchanged():
    df = pd.DataFrame({"identity": ["a"], "swept": ["init.gamma"], "config/init.gamma": [1.0], "final_val_loss": [3.0]})
    assert schema.upgrade(df) is df


@pytest.mark.parametrize(("path", "key"), [("model.init.gamma", "init.gamma"), ("model.norm.eps", "norm.eps"),
                                           ("model.attn.gate", "attn.gate"), ("preset", "model.preset"),
                                           ("model.d_model", "model.d_model"), ("model.initial", "model.initial"),
                                           ("optim.lr", "optim.lr")])
def test_a_resolved_config_path_maps_to_the_key_a_user_types(path, key):
    assert schema.key_of(path) == key


def test_every_short_name_is_a_key_the_command_line_takes():
    """Each SHORT_NAMES key composes: a typo there would leave a setting out of every comparison."""
    from smallinit.trainer.config import TrialArgs

    config = schema.config_columns(TrialArgs().build().to_dict())
    assert all(schema.config_column(key) in config for key in schema.SHORT_NAMES.values())
