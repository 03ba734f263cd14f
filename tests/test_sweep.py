"""The sweep command end to end, run as a user would: `python sweep.py -m ...` in a folder.

Real Ray (local), real Optuna storage (SQLite), real wandb in offline mode, real text.
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pandas as pd
import pytest

from smallinit.trainer.machine import host_memory

from .conftest import (
    CARD,
    KILLABLE,
    REPO,
    TINY,
    kill_driver_mid_sweep,
    result_mtimes,
    run_cli,
    study_trials,
    sweep,
)


def wandb_runs(sweep_dir: Path) -> list[Path]:
    return sorted(sweep_dir.glob("trials/*/wandb/offline-run-*/run-*.wandb"))


@pytest.mark.slow
def test_card_command_runs_every_trial_once_and_a_rerun_trains_nothing(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, *CARD, "wandb.mode=offline", "name=card")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "card"
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(df) == 8 and set(df["state"]) == {"COMPLETE"} and df["identity"].is_unique
    assert sorted(zip(df["config/init.gamma"], df["config/norm.eps"])) == sorted(
        (g, e) for g in (0.5, 0.75, 1.0, 1.25) for e in (1e-5, 1e-12))
    assert set(df["swept"]) == {"init.gamma,norm.eps"}  # each value once: no param.*, gamma or eps copies
    assert not {"gamma", "eps", "param.init.gamma", "config/model.init.gamma"} & set(df.columns)
    assert (df["final_val_loss"] > 0).all() and (df["n_params"] > 0).all() and (df["tokens"] == 1024).all()
    trials = study_trials(sweep_dir, "card")
    assert len(trials) == 8 and {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert {t.user_attrs["identity"] for t in trials} == set(df["identity"])
    assert all(len(t.intermediate_values) == 3 for t in trials)  # steps 0, 4, 8
    assert len(wandb_runs(sweep_dir)) == 8
    assert "lowest single trial: trial" in proc.stdout and "results.parquet" in proc.stdout
    # Each trial folder holds its composed config and overrides, as Hydra's job folders do.
    overrides = (sweep_dir / "trials" / df["identity"][0] / ".hydra" / "overrides.yaml").read_text()
    assert "init.gamma=" in overrides and "norm.eps=" in overrides

    before = result_mtimes(sweep_dir)
    ray_session = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "session_latest")
    session_before = ray_session.resolve()
    again = sweep(tmp_path, data_cache, *CARD, "wandb.mode=offline", "name=card")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "8 trials (8 already done)" in again.stdout
    assert ray_session.resolve() == session_before  # nothing to run: no Ray session was started
    assert result_mtimes(sweep_dir) == before
    assert len(pd.read_parquet(sweep_dir / "results.parquet")) == 8
    assert len(study_trials(sweep_dir, "card")) == 8
    assert len(wandb_runs(sweep_dir)) == 8

    # A grid that grows (one more gamma) runs only the new points on the same study.
    grown = [a if not a.startswith("init.gamma=") else a + ",1.5" for a in CARD]
    more = sweep(tmp_path, data_cache, *grown, "wandb.mode=disabled", "name=card")
    assert more.returncode == 0, more.stderr[-3000:]
    assert "10 trials (8 already done)" in more.stdout
    assert {k: v for k, v in result_mtimes(sweep_dir).items() if k in before} == before
    assert len(study_trials(sweep_dir, "card")) == 10


@pytest.mark.slow  # ~60 s: a sweep killed with -9 once two trials finished, then its rerun; `make test-slow`
def test_killed_driver_resumes_without_duplicates_or_retraining(tmp_path, data_cache):
    finished = kill_driver_mid_sweep(tmp_path, data_cache, KILLABLE)
    sweep_dir = tmp_path / "sweeps" / "killed"
    proc = sweep(tmp_path, data_cache, *KILLABLE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(df) == 8 and df["identity"].is_unique and set(df["state"]) == {"COMPLETE"}
    trials = study_trials(sweep_dir, "killed")
    assert len(trials) == 8 and sorted(t.user_attrs["identity"] for t in trials) == sorted(df["identity"])
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    after = result_mtimes(sweep_dir)
    assert {k: after[k] for k in finished} == finished  # finished trials were not trained again


@pytest.mark.slow
def test_optuna_search_with_asha_prunes_and_reports_a_best_gamma(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, "init.gamma=interval(0.25,1.5)", "hydra.sweeper.n_trials=6",
                 "hydra.sweeper.asha.enabled=true", "hydra.sweeper.asha.grace_period=2", "train.max_tokens=2048",
                 "train.eval_every=2", "train.probe_every=0", "wandb.mode=disabled", "name=search")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "search"
    df = pd.read_parquet(sweep_dir / "results.parquet")
    trials = study_trials(sweep_dir, "search")
    assert len(df) == len(trials) == 6
    states = {t.state for t in trials}
    assert optuna.trial.TrialState.PRUNED in states and optuna.trial.TrialState.COMPLETE in states
    assert (df["state"] == "PRUNED").sum() == sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)
    assert all(0.25 <= t.params["init.gamma"] <= 1.5 for t in trials)
    assert "lowest single trial: trial" in proc.stdout and "init.gamma" in proc.stdout.split("lowest single trial: trial")[1]


@pytest.mark.slow
def test_a_failing_trial_is_recorded_and_the_others_finish(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, "optim.lr=1e-3,1e12", "optim.grad_clip=null", "optim.warmup_frac=0",
                 "train.max_tokens=4096", "wandb.mode=disabled", "name=fails")
    assert proc.returncode == 1, proc.stderr[-3000:]  # the others finished, and the status says one did not
    assert proc.stderr.strip().splitlines()[-1].startswith("error: 1 of 2 trials of this run failed")
    df = pd.read_parquet(tmp_path / "sweeps" / "fails" / "results.parquet").set_index("config/optim.lr")
    assert df.loc[1e-3, "state"] == "COMPLETE"
    assert df.loc[1e12, "state"] == "FAIL" and "diverged at step" in df.loc[1e12, "fail_reason"]
    trials = {t.params["optim.lr"]: t for t in study_trials(tmp_path / "sweeps" / "fails", "fails")}
    assert trials[1e12].state == optuna.trial.TrialState.FAIL
    assert "diverged at step" in trials[1e12].user_attrs["fail_reason"]
    # The reason reaches the screen, with the trial's own log (its output and the traceback).
    log = tmp_path / "sweeps" / "fails" / df.loc[1e12, "trial_dir"] / "trial.log"
    reason, trial = proc.stdout.split("failed (1 trial): ")[1].splitlines()[:2]
    assert "diverged at step" in reason and trial.startswith("    trial ") and trial.endswith(f"full log: {log}")
    assert "TrialDiverged" in log.read_text() and "dtype:" in log.read_text()
    assert "dtype:" in (tmp_path / "sweeps" / "fails" / df.loc[1e-3, "trial_dir"] / "trial.log").read_text()
    # Tune runs the trial on its own thread: the allocator setting must come with the worker's start.
    if host_memory.worker_env():  # glibc, and no allocator setting of the user's in this environment
        assert f"host allocator: {host_memory.KEPT} (set at process start)" in log.read_text()


@pytest.mark.slow
def test_max_failure_rate_stops_a_broken_sweep(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, "optim.lr=1e10,1e11,1e12,1e13,1e14,1e15", "optim.grad_clip=null",
                 "optim.warmup_frac=0", "train.max_tokens=4096", "hydra.sweeper.max_failure_rate=0.5",
                 "hydra.sweeper.max_concurrent=1", "wandb.mode=disabled", "name=broken")
    assert proc.returncode != 0
    assert "above hydra.sweeper.max_failure_rate=0.5" in proc.stderr.strip().splitlines()[-1]
    df = pd.read_parquet(tmp_path / "sweeps" / "broken" / "results.parquet")
    assert 3 <= (df["state"] == "FAIL").sum() < 6  # stopped before running everything
    assert len(df) == 6 and set(df["state"]) <= {"FAIL", "INTERRUPTED"}  # the unrun ones are listed too


@pytest.mark.slow
def test_two_node_cluster_runs_trials_on_both_nodes(tmp_path, data_cache):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        proc = run_cli(["-m", *TINY, "init.gamma=0.5,0.75,1.0,1.25", f"ray.address={cluster.address}",
                        "train.max_tokens=4096", "name=cluster"], cwd=tmp_path,
                       env={"SMALLINIT_CACHE": str(data_cache)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        df = pd.read_parquet(tmp_path / "sweeps" / "cluster" / "results.parquet")
        assert len(df) == 4 and set(df["state"]) == {"COMPLETE"}
        assert df["node_id"].nunique() == 2
    finally:
        cluster.shutdown()


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


BAD_INPUT = [
    (["model.not_a_key=1"], "not_a_key"),
    (["hydra.sweeper.reuse_workers=maybe"], "hydra.sweeper.reuse_workers=maybe is invalid: must be true or false"),
    (["init.gamma=-1"], "init.gamma=-1 is invalid: must be > 0"),
    (["init.gamma=abc"], "init.gamma=abc is invalid: must be a number"),
    (["init.gamma=0.5,-1"], "init.gamma=-1 is invalid"),
    (["norm.eps=-1e-5"], "norm.eps=-1e-05 is invalid: must be >= 0"),
    (["attn.gate=sideways"], "attn.gate='sideways' is invalid: one of"),
    (["train.compile=maybe"], "train.compile='maybe' is invalid: one of ['auto', 'true', 'false']"),
    (["norm.type=batchnorm"], "norm.type='batchnorm' is invalid: one of"),
    (["model.n_heads=3"], "model.n_heads=3 is invalid: must divide model.d_model"),
    (["model.ffn={type: moe, n_experts: 4, top_k: 8}"], "ffn.top_k=8 is invalid: must be <= ffn.n_experts (4)"),
    (["model=giant"], "giant"),
    (["init.gamma=interval(1)"], "init.gamma=interval(1) is invalid"),
    (["init.gamma=range(1,1)"], "has no values"),
    (["data=text", "data.paths=[/nonexistent/*.txt]"], "data.paths"),
    (["ray.address=127.0.0.1:1"], "ray.address='127.0.0.1:1' is invalid"),
    (["hydra.sweeper.storage=nosuchdb://x"], "hydra.sweeper.storage='nosuchdb://x' is invalid"),
    (["train.max_tokens=0"], "train.max_tokens=0 is invalid"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_fails_before_any_trial_in_one_line(tmp_path, data_cache, args, message):
    proc = sweep(tmp_path, data_cache, *args, "wandb.mode=disabled", "name=bad", timeout=180)
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert message in last, proc.stderr[-2000:]
    sweep_dir = tmp_path / "sweeps" / "bad"
    assert not (sweep_dir / "results.parquet").exists()
    assert not (sweep_dir / "trials").exists()
    if (sweep_dir / "optuna.db").exists():
        assert optuna.get_all_study_summaries(f"sqlite:///{sweep_dir / 'optuna.db'}") == []


def test_results_columns_are_documented():
    from smallinit.core import results_schema as schema

    readme = (REPO / "docs" / "sweeps.md").read_text()  # "The results table", linked from the README
    # Every column the schema defines (the table's own list), the settings' prefix, the old names' map.
    for column in [*schema.COLUMNS, f"{schema.CONFIG_PREFIX}<key>", schema.RESULTS_CSV, "param.<key>", *schema.SHORT_NAMES]:
        assert f"`{column}`" in readme, column


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_a_sweep_on_your_own_text_with_a_relative_path(tmp_path, data_cache):
    docs = tmp_path / "mytext"
    docs.mkdir()
    words = "the quick brown fox jumps over the lazy dog while small init keeps the residual stream calm".split()
    for i in range(8):
        paragraphs = [" ".join(words[(i + j) % len(words):] + words[: (i + j) % len(words)]) for j in range(40)]
        (docs / f"doc{i}.txt").write_text("\n\n".join(paragraphs))
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "data=text", "data.paths=[mytext/*.txt]",
                 "data.vocab_size=300", "data.val_fraction=0.25", "train.eval_tokens=128",
                 "train.per_token_eval_tokens=64", "wandb.mode=disabled", "name=owntext")
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_parquet(tmp_path / "sweeps" / "owntext" / "results.parquet")
    assert list(df["state"]) == ["COMPLETE", "COMPLETE"]
    assert df["final_val_loss"].notna().all()
    # The driver pinned the relative glob to this folder, so workers read the same files.
    config = (tmp_path / "sweeps" / "owntext" / df["trial_dir"][0] / "trial.json").read_text()  # relative to the sweep
    assert str(docs / "*.txt") in config


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_a_folder_keeps_its_question_and_new_keys_are_refused(tmp_path, data_cache):
    first = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "wandb.mode=disabled", "name=q")
    assert first.returncode == 0, first.stderr[-3000:]
    record = tmp_path / "sweeps" / "q" / "fixed_overrides.json"
    before = record.read_text()
    # Another fixed override (a longer budget) in the same folder: another question, refused.
    other = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "train.max_tokens=2048", "wandb.mode=disabled", "name=q")
    assert other.returncode != 0 and "train.max_tokens=2048" in other.stderr and "name=" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1 and record.read_text() == before
    # Growing the grid, picking a subset of it, or changing only where trials run is allowed.
    grown = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0,1.25", "wandb.mode=offline", "name=q")
    assert grown.returncode == 0 and "3 trials (2 already done)" in grown.stdout, grown.stderr[-3000:]
    subset = sweep(tmp_path, data_cache, "init.gamma=1.0", "name=q", "wandb.mode=disabled")
    assert subset.returncode == 0 and "1 trials (1 already done)" in subset.stdout, subset.stderr[-3000:]
    # A key no config has: refused before anything starts, in one line.
    added = sweep(tmp_path, data_cache, "+foo=1,2", "name=foo")
    assert added.returncode != 0 and "+foo=1,2 is invalid" in added.stderr and not (tmp_path / "sweeps" / "foo").exists()


@pytest.mark.integration
@pytest.mark.slow
def test_show_prints_each_trial_as_it_will_train(tmp_path):
    proc = run_cli(["--show", "model=micro", "model.d_model=128", "model.head_dim=64"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "d_model: 128" in proc.stdout and "n_heads: 2" in proc.stdout and "d_ff: 384" in proc.stdout  # preset filled
    assert "runs here" in proc.stdout and not (tmp_path / "runs").exists()  # nothing trained
    grid = run_cli(["--show", "-m", "+experiment=gate"], cwd=tmp_path, timeout=120)
    assert grid.returncode == 0, grid.stderr[-2000:]
    # Select, then confirm: the first round (4 arms x 3 lrs on the tuning seed) is listed, and both stages' plan.
    assert "12 trial(s), grid" in grid.stdout and "Ray Tune trial" in grid.stdout and "not used" in grid.stdout
    listed = [line.split()[1] for line in grid.stdout.splitlines() if line.startswith("#   ")]
    assert len(listed) == len(set(listed)) == 12
    assert "# stage 1 (tune): 4 setting(s) x optim.lr=0.001,0.003,0.01 x seed in [100] = 12 trials" in grid.stdout
    assert "# stage 2 (confirm): 4 setting(s) at the value(s) stage 1 chooses x seed in [1, 2, 3, 4] = 16 trials" \
        in grid.stdout
