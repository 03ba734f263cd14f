"""The trial folder (core.trial_dir) and the results table's columns (core.results_schema):
file names that existing sweep folders hold, round trips, what a missing or damaged file reads
as, atomic writes, and a table written by the sweeper read back by the report."""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict

import pandas as pd
import pytest

from smallinit.core import results_schema as schema
from smallinit.core.trial_dir import DamagedFile, TrialDir
from smallinit.model.config import InitConfig, ModelConfig
from smallinit.trainer.config import OptimConfig, TrainConfig, TrialConfig

# property -> the file name on disk: sweep folders written before TrialDir existed hold these.
NAMES = {
    "sweep_json": "sweep.json", "placement_json": "placement.json", "trial_json": "trial.json",
    "metrics": "metrics.jsonl", "probes": "probes", "checkpoint": "checkpoint.pt",
    "per_token_losses": "per_token_losses.npz", "model_weights": "model.pt", "result_json": "result.json",
    "failure_json": "failure.json", "budgets": "budgets", "hydra_config": ".hydra/config.yaml", "hydra_overrides": ".hydra/overrides.yaml",
}


@pytest.mark.parametrize(("prop", "name"), NAMES.items())
def test_file_names_are_the_ones_existing_folders_hold(tmp_path, prop, name):
    assert getattr(TrialDir(tmp_path), prop) == tmp_path / name


def test_sweep_layout_and_probe_snapshot_names(tmp_path):
    d = TrialDir.in_sweep(tmp_path, "abc123")
    assert d.path == tmp_path / "trials" / "abc123" and d.identity == "abc123"
    assert d.probe_snapshot(40).name == "step_0000040.npz"
    assert TrialDir.all_in_sweep(tmp_path) == []  # before anything is planned
    for ident in ("b", "a"):
        TrialDir.in_sweep(tmp_path, ident).write_trial(ident, {})
    assert [x.identity for x in TrialDir.all_in_sweep(tmp_path)] == ["a", "b"]


def test_round_trips(tmp_path):
    d = TrialDir(tmp_path / "t")
    assert d.recorded_workers() == 1  # nothing written yet
    d.write_sweep_plan({"init.gamma": 0.5}, ["init.gamma=0.5"], "t", {"x": 1}, workers=2)
    assert d.recorded_workers() == 2  # planned for 2
    d.write_trial("t", {"x": 1})
    d.record_attempt("node-a", "host", 11)
    d.record_attempt("node-b", "host", 12)
    d.write_failure("boom", "Traceback ...", "transient")
    d.write_result({"identity": "t", "steps": 8})
    assert d.read_sweep_plan() == {"params": {"init.gamma": 0.5}, "overrides": ["init.gamma=0.5"], "identity": "t",
                                   "config": {"x": 1}, "workers": 2}
    assert d.read_trial() == {"identity": "t", "config": {"x": 1}, "workers": 1}
    assert d.recorded_workers() == 1  # trial.json, written when training starts, has the word
    assert [a["node_id"] for a in d.read_attempts()] == ["node-a", "node-b"]
    assert [a["pid"] for a in d.read_attempts()] == [11, 12]
    assert d.read_failure() == {"reason": "boom", "traceback": "Traceback ...", "kind": "transient"}
    assert d.read_result() == {"identity": "t", "steps": 8}
    assert d.finished and d.failed
    d.clear_failure()  # the trial runs again: the folder no longer says it failed
    assert not d.failed and d.read_failure() is None


def test_a_missing_file_reads_as_nothing(tmp_path):
    d = TrialDir(tmp_path)
    for damaged_ok in (False, True):
        assert d.read_trial(damaged_ok) is None and d.read_result(damaged_ok) is None
        assert d.read_failure(damaged_ok) is None and d.read_attempts(damaged_ok) == []
    assert d.read_sweep_plan() == {} and d.last_metrics() == {}
    assert not d.finished and not d.failed
    d.drop_checkpoint()  # nothing to drop is fine


READERS = {
    "trial_json": TrialDir.read_trial, "result_json": TrialDir.read_result,
    "failure_json": TrialDir.read_failure, "placement_json": TrialDir.read_attempts,
}


@pytest.mark.parametrize("prop", READERS)
def test_a_truncated_file_raises_unless_damaged_ok(tmp_path, prop):
    """Strict for the trainer and the worker (a damaged result.json must not read as "not
    finished" and be trained over); tolerant for the results table."""
    d = TrialDir(tmp_path)
    getattr(d, prop).write_text('{"identity": "t", "ste')
    with pytest.raises(json.JSONDecodeError) as raised:
        READERS[prop](d)
    assert READERS[prop](d, damaged_ok=True) in (None, [])
    # The message names the file; the error crosses from a Ray worker to the driver intact.
    assert str(raised.value).startswith(f"{getattr(d, prop)} is damaged (")
    again = pickle.loads(pickle.dumps(raised.value))
    assert type(again) is DamagedFile and str(again) == str(raised.value)


def test_a_truncated_sweep_plan_reads_as_empty(tmp_path):
    d = TrialDir(tmp_path)
    d.sweep_json.write_text('{"params": {')
    assert d.read_sweep_plan() == {}


def test_last_metrics_keeps_each_keys_latest_value(tmp_path):
    d = TrialDir(tmp_path)
    d.metrics.write_text('{"step": 0, "val/loss": 5.0}\n\n{"step": 4, "val/loss": 4.0, "tokens": 64}\n'
                         '{"step": 8, "val/loss": null, "tokens": 128}\n')
    assert d.last_metrics() == {"step": 8, "val/loss": 4.0, "tokens": 128}  # null does not erase a value
    d.metrics.write_text('{"step": 0}\n{"step": 4, "val/lo')  # a last line a kill cut short: left out
    assert d.last_metrics() == {"step": 0}
    d.metrics.write_text('{"step": 0}\n{"step": 4, "val/lo\n{"step": 8}\n')  # cut inside the file: damage
    with pytest.raises(DamagedFile, match="line 2 is not JSON"):
        d.last_metrics()


def test_writes_are_atomic_and_leave_no_temporary_files(tmp_path):
    d = TrialDir(tmp_path)
    d.write_result({"steps": 1})

    class Unwritable:
        def __str__(self):
            raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        d.write_result({"steps": Unwritable()})
    assert d.read_result() == {"steps": 1}  # the old file, whole
    d.write_trial("t", {})
    d.record_attempt(None, "host", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["placement.json", "result.json", "trial.json"]


def test_artifacts_name_the_outputs(tmp_path):
    """Relative to the folder (a copied folder names its own files); artifact() reads them back."""
    d = TrialDir(tmp_path)
    assert d.artifacts(per_token_losses=True) == {"metrics": "metrics.jsonl", "probes": "probes",
                                                  "per_token_losses": "per_token_losses.npz", "model": "model.pt"}
    assert d.artifacts(per_token_losses=False)["per_token_losses"] == ""
    assert [d.artifact(v) for v in d.artifacts(per_token_losses=True).values()] == [
        d.metrics, d.probes, d.per_token_losses, d.model_weights]


# ---- the results table ----

def _trial(gamma: float, seed: int) -> TrialConfig:
    model = ModelConfig.preset("nano", init=InitConfig(gamma=gamma, seed=seed))
    return TrialConfig(model=model, optim=OptimConfig(), train=TrainConfig(seed=seed), preset="nano")


def _finish(d: TrialDir, trial: TrialConfig, loss: float) -> None:
    from smallinit.trainer.loop import TrialResult

    final = {"val/loss": loss, "attn_sink/mean": 0.25, "stable_rank/mean": 3.0, "row_cosine/mean": 0.1,
             "saturation/mean": 0.0, "residual_ratio/mean": 1.5, "anchor/acc_copy": 0.75}
    result = TrialResult(identity=trial.identity(), steps=8, tokens=1024, n_params=trial.model.num_params(),
                         final_val_loss=loss, best_val_loss=loss, unigram_entropy=6.0, wall_s=2.0, tokens_per_s=512.0,
                         mfu=None, final_metrics=final, artifacts=d.artifacts(per_token_losses=True))
    d.write_result(asdict(result))


def _sweep(root) -> dict[str, dict]:
    """Five trials, one in each state the folder decides or the study passes through."""
    states = {}
    for number, (gamma, seed, how) in enumerate([(0.5, 0, "complete"), (1.0, 0, "complete"), (0.5, 1, "fail"),
                                                 (1.0, 1, "planned"), (2.0, 0, "pruned")]):
        trial = _trial(gamma, seed)
        if how == "planned":  # planned for 2 workers: its own identity, and the table says so
            d = TrialDir.in_sweep(root, trial.identity(2))
            d.write_sweep_plan({"init.gamma": gamma, "seed": seed}, [f"init.gamma={gamma}", f"seed={seed}"],
                               trial.identity(2), trial.to_dict(), workers=2)
            states[trial.identity(2)] = {"number": number, "state": "RUNNING"}
            continue
        d = TrialDir.in_sweep(root, trial.identity())
        d.write_sweep_plan({"init.gamma": gamma, "seed": seed}, [f"init.gamma={gamma}", f"seed={seed}"],
                           trial.identity(), trial.to_dict())
        states[trial.identity()] = {"number": number, "state": "COMPLETE"}
        d.record_attempt("node-1", "host", 100 + number)
        d.write_trial(trial.identity(), trial.to_dict())
        if how == "complete":
            _finish(d, trial, loss=4.0 - gamma)
        elif how == "fail":
            d.write_failure("TrialDiverged: diverged at step 3: loss=nan", "")
            states[trial.identity()]["state"] = "FAIL"
        else:
            d.metrics.write_text('{"step": 4, "val/loss": 5.5, "val/best_loss": 5.5, "tokens": 512}\n')
            states[trial.identity()]["state"] = "PRUNED"
    return states


# The parquet types of the table above (large_string where pandas stores str as arrow's
# large string): files written before core.results_schema existed hold the same, so old sweep
# folders still load. A column of only None is stored as null.
PARQUET_TYPES = {
    "trial_number": "int64", "identity": "string", "trial_identity": "string", "state": "string", "fail_reason": "string", "role": "null",
    "swept": "string", "n_params": "double", "workers": "int64", "dtype": "string", "budget_tokens": "int64", "tokens": "double",
    "corpus_tokens": "null", "final_val_loss": "double",
    "best_val_loss": "double", "unigram_entropy": "double", "wall_s": "double", "tokens_per_s": "double",
    "mfu": "null", "node_id": "string", "attempts": "int64", "trial_dir": "string", "metrics_path": "string",
    "per_token_losses_path": "string", "probes_dir": "string", "attn_sink": "double", "stable_rank": "double",
    "row_cosine": "double", "saturation": "double", "residual_ratio": "double", "anchor_acc_copy": "double",
}


def test_the_sweepers_table_has_the_schemas_columns_and_types(tmp_path):
    import pyarrow.parquet as pq

    from smallinit.sweeper.results.results import build_table, write_table

    path = write_table(tmp_path, build_table(tmp_path, _sweep(tmp_path)))
    stored = [(f.name, str(f.type).removeprefix("large_")) for f in pq.read_schema(path)]
    fixed = [(n, t) for n, t in stored if not n.startswith(schema.CONFIG_PREFIX)]
    assert fixed == list(PARQUET_TYPES.items())  # names, order and types
    assert stored[:len(fixed)] == fixed  # the config/<key> columns come last, the swept ones first
    assert [n for n, _ in stored[len(fixed):len(fixed) + 2]] == ["config/init.gamma", "config/seed"]
    df = pd.read_parquet(path)
    assert all(schema.is_known_column(c) for c in df.columns)
    for column in schema.COLUMNS.values():  # each known value is of its declared kind
        known = df[column.name].dropna()
        if column.kind is str:
            assert known.map(lambda v: isinstance(v, str)).all(), column.name
        elif len(known):
            assert pd.api.types.is_numeric_dtype(known), column.name
    assert list(df["state"]) == ["COMPLETE", "COMPLETE", "FAIL", "INTERRUPTED", "PRUNED"]
    assert list(df["attempts"]) == [1, 1, 1, 0, 1] and pd.isna(df["node_id"].iloc[3])
    assert list(df["workers"]) == [1, 1, 1, 2, 1]  # the planned trial's from its sweep.json
    pruned = df.iloc[4]
    assert pruned["final_val_loss"] == 5.5 and pruned["tokens"] == 512 and pd.isna(pruned["n_params"])


def test_the_table_has_every_config_key_as_a_column_and_a_csv_twin(tmp_path):
    from smallinit.sweeper.results.results import build_table, write_table

    states = _sweep(tmp_path)
    path = write_table(tmp_path, build_table(tmp_path, states))
    df = pd.read_parquet(path)
    trial = _trial(0.5, 0)
    # Every leaf of trial.json's config, swept (init.gamma) or not (optim.lr, train.max_tokens),
    # by the key a user types, and each value under that one name.
    flat = schema.config_columns(trial.to_dict())
    assert set(flat) <= set(df.columns)
    assert {"config/init.gamma", "config/norm.eps", "config/attn.gate", "config/optim.lr", "config/train.max_tokens",
            "config/model.preset", "config/model.d_model"} <= set(flat)
    assert not {"gamma", "lr", "eps", "train_seed", "config/model.init.gamma", "config/preset"} & set(df.columns)
    assert not [c for c in df.columns if c.startswith("param.")]
    assert set(df[schema.SWEPT]) == {"init.gamma,seed"} and schema.swept_keys(df) == ["init.gamma", "seed"]
    row = df[df[schema.TRIAL_IDENTITY] == trial.identity()].iloc[0]
    assert row["config/init.gamma"] == 0.5
    assert row["config/optim.lr"] == trial.optim.lr
    assert row["config/train.max_tokens"] == trial.train.max_tokens
    assert list(df["config/init.gamma"]) == [0.5, 1.0, 0.5, 1.0, 2.0]  # the planned trial's from sweep.json
    # The CSV twin: the same rows and columns.
    csv = pd.read_csv(schema.csv_path(tmp_path))
    assert list(csv.columns) == list(df.columns) and len(csv) == len(df)
    assert list(csv[schema.IDENTITY]) == list(df[schema.IDENTITY])
    assert list(csv["config/optim.lr"]) == list(df["config/optim.lr"])
    assert pd.Series(csv["final_val_loss"]).equals(df["final_val_loss"])


def test_config_columns_flatten_with_dotted_keys_and_lists_as_json():
    flat = schema.config_columns({"model": {"init": {"gamma": 0.5}, "extra": {}}, "train": {"budgets": [1, 2]},
                                  "preset": None})
    assert flat == {"config/init.gamma": 0.5, "config/model.extra": "{}", "config/train.budgets": "[1, 2]",
                    "config/model.preset": None}


def test_a_config_key_of_mixed_kinds_is_stored_as_text(tmp_path):
    from smallinit.sweeper.results.results import _one_kind, write_table

    assert _one_kind(pd.Series([1, 2.5, None])).tolist()[:2] == [1, 2.5]  # numbers stay numbers
    df = pd.DataFrame({"identity": ["a", "b", "c"], "config/train.threads": [4, "auto", True]})
    df["config/train.threads"] = _one_kind(df["config/train.threads"])
    assert list(df["config/train.threads"]) == ["4", "auto", "true"]
    assert list(pd.read_parquet(write_table(tmp_path, df))["config/train.threads"]) == ["4", "auto", "true"]


def test_the_report_reads_what_the_sweeper_wrote(tmp_path):
    from smallinit.experiments.data.load import LOSS, SEED_COLS, SIZE_COLS, load
    from smallinit.sweeper.results.results import build_table, write_table

    states = _sweep(tmp_path)
    write_table(tmp_path, build_table(tmp_path, states))
    sweep = load([tmp_path])
    assert len(sweep.results) == 5 and sorted(sweep.complete["gamma"]) == [0.5, 1.0]
    assert sorted(sweep.complete[LOSS]) == [3.0, 3.5]
    assert all(c in schema.COLUMNS or c in schema.SHORT_NAMES for c in (*SIZE_COLS, *SEED_COLS, LOSS))


def test_files_written_atomically_honour_the_umask(tmp_path):
    """A team sharing a sweep folder reads each other's results: the tool's files get the mode
    a plain open() would give (mkstemp's own is 0600)."""
    import os

    from smallinit.core.files import atomic_write_json

    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "shared.json", {"a": 1})
        os.umask(0o077)
        atomic_write_json(tmp_path / "private.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "shared.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.json").stat().st_mode & 0o777 == 0o600
