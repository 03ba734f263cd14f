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
    settings = [c for c in new.columns if c.startswith("config/")]  # last, the swept ones first, as written today
    assert list(new.columns[-len(settings):]) == settings and settings[:3] == ["config/arm", "config/optim.lr", "config/seed"]
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


def test_a_record_reads_each_table_once_and_quotes_the_hash_of_those_bytes(tmp_path, monkeypatch):
    """records.whole_runs compares the rows, copies them beside its record and quotes their sha256
    from one read of each table (sweep_records.Table), so a live sweep rewriting the file between
    cannot make the copy, the hash and the numbers disagree."""
    import hashlib
    import json

    from records import whole_runs
    from smallinit.experiments.data import sweep_records

    folders = []
    for name, schedule in (("wsd", "wsd"), ("cos", "cosine")):
        folder = tmp_path / name
        folder.mkdir()
        pd.DataFrame([{"identity": f"{arm}{s}", "state": "COMPLETE", "tokens": 4096, "budget_tokens": 4096,
                       "swept": "arm,seed", "config/arm": arm, "config/seed": s, "config/train.seed": s,
                       "config/optim.lr": 1e-3, "config/model.d_model": 128, "config/init.gamma": gamma,
                       "config/optim.schedule": schedule, "final_val_loss": 4.4 + 0.01 * s + (gamma - 0.5) * 0.1, "trial_dir": f"trials/{arm}{s}"}
                      for s in range(1, 7) for arm, gamma in (("baseline", 0.5), ("small", 1.0))]
                     ).to_parquet(folder / "results.parquet")
        folders.append(folder)
    reads = []
    real = sweep_records.read_table_once
    monkeypatch.setattr(sweep_records, "read_table_once", lambda f: reads.append(f) or real(f))
    out = tmp_path / "record"
    assert whole_runs.main([*map(str, folders), "--seeds", "1-6", "--out", str(out)]) == 0
    assert sorted(reads) == sorted(folders)  # each table read once
    provenance = json.loads((out / "summary.json").read_text())["provenance"]
    for folder in folders:
        assert provenance["results_sha256"][folder.name] == hashlib.sha256((folder / "results.parquet").read_bytes()).hexdigest()
