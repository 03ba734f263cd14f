"""Crashes, concurrency, secrets and scale: nothing lost, nothing duplicated, nothing leaked."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest

from smallinit.core.files import atomic_write_json

from .conftest import REPO, TINY_SWEEP, grid_trials, sweep, sweeps_at_once


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_json(path, {"ok": 1})

    class Boom:
        def __str__(self):
            raise RuntimeError("interrupted mid-write")

    with pytest.raises(RuntimeError):
        atomic_write_json(path, {"bad": Boom()})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left behind


def start_and_kill_the_worker(tmp_path, data_cache, *extra) -> tuple[subprocess.Popen, Path]:
    """A one-trial sweep whose Ray worker is killed with SIGKILL once it has checkpointed."""
    args = ["init.gamma=1.0", "train.max_tokens=8192", "train.eval_every=8", "train.ckpt_every=8",
            "train.probe_every=0", "wandb.mode=disabled", "name=workerkill", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache)}
    driver = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), "-m", *TINY_SWEEP, *args], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trial_dirs = tmp_path / "sweeps" / "workerkill" / "trials"
    deadline = time.time() + 300
    checkpoint = None
    while time.time() < deadline and driver.poll() is None:
        found = list(trial_dirs.glob("*/checkpoint.pt"))
        if found and (found[0].parent / "placement.json").exists():
            checkpoint = found[0]
            break
        time.sleep(0.2)
    assert checkpoint is not None, "the trial never checkpointed"
    os.kill(json.loads((checkpoint.parent / "placement.json").read_text())[-1]["pid"], signal.SIGKILL)
    return driver, tmp_path / "sweeps" / "workerkill"


@pytest.mark.slow  # ~40 s: a worker killed mid-trial, retried from its checkpoint; `make test-slow`
def test_a_killed_ray_worker_is_retried_from_its_checkpoint(tmp_path, data_cache):
    driver, sweep_dir = start_and_kill_the_worker(tmp_path, data_cache)
    out, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-3000:]
    # One line for the retry, not Tune's 25-line Ray traceback (TUNE_PRINT_ALL_TRIAL_ERRORS=0, ProgressTable).
    assert "Traceback" not in out + err
    assert "trial 0: its Ray worker died (ActorDiedError); retrying from its last checkpoint (retry 1 of 2)\n" in out
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(df) == 1 and df["state"][0] == "COMPLETE" and df["attempts"][0] == 2
    metrics = sweep_dir / df["metrics_path"][0]  # stored relative to the sweep
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 64  # resumed, no step logged twice
    assert steps[0] == 0 and 8 in steps  # the second attempt kept the first attempt's history


@pytest.mark.slow
def test_a_killed_ray_worker_without_retries_left_is_one_line_naming_the_error_file(tmp_path, data_cache):
    driver, sweep_dir = start_and_kill_the_worker(tmp_path, data_cache, "hydra.sweeper.max_retries=0")
    out, err = driver.communicate(timeout=600)
    assert driver.returncode == 1 and "Traceback" not in out + err
    error_txt = next((sweep_dir / "ray" / "tune").glob("trial_0_*/error.txt"))
    assert (f"trial 0: its Ray worker died (ActorDiedError) and its retries (hydra.sweeper.max_retries=0) are used "
            f"up: recorded as failed; its error is in {error_txt}\n") in out
    assert "The actor died unexpectedly" in error_txt.read_text()
    assert pd.read_parquet(sweep_dir / "results.parquet")["state"].tolist() == ["FAIL"]


@pytest.mark.slow  # ~45 s: two sweeps at once on one SQLite file; `make test-slow`
def test_two_sweeps_share_one_study_storage_at_once(tmp_path, data_cache):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    results = sweeps_at_once(tmp_path, data_cache, storage, {"left": "0.5,0.75,1.0", "right": "1.0,1.25,1.5"})
    for name in ("left", "right"):
        assert results[name].returncode == 0, results[name].stderr[-3000:]
        study = optuna.load_study(study_name=name, storage=storage)
        assert len(study.trials) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
        assert len(pd.read_parquet(tmp_path / "sweeps" / name / "results.parquet")) == 3


@pytest.mark.slow
def test_a_wandb_key_never_lands_in_outputs(tmp_path, data_cache):
    secret = "sk-test-4f1b2c9d8e7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c"
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "wandb.mode=offline", "name=secret",
                 env={"WANDB_API_KEY": secret})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert secret not in proc.stdout and secret not in proc.stderr
    leaked = [p for p in (tmp_path / "sweeps").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaked == []


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_same_study_name_in_two_folders_does_not_mix_trials(tmp_path, data_cache):
    storage = f"sqlite:///{tmp_path / 'team.db'}"
    first = sweep(tmp_path, data_cache, "init.gamma=0.5", f"hydra.sweeper.storage={storage}",
                  "hydra.sweeper.study_name=team", "wandb.mode=disabled", "name=a")
    assert first.returncode == 0, first.stderr[-2000:]
    second = sweep(tmp_path, data_cache, "init.gamma=0.5", f"hydra.sweeper.storage={storage}",
                   "hydra.sweeper.study_name=team", "wandb.mode=disabled", "name=b")
    assert second.returncode == 0, second.stderr[-2000:]
    # Same identity, same study: the second folder reuses the finished trial instead of a duplicate.
    assert len(study_trials_at(storage, "team")) == 1
    assert "1 trials (1 already done)" in second.stdout
    assert len(pd.read_parquet(tmp_path / "sweeps" / "b" / "results.parquet")) == 1


def study_trials_at(storage, name):
    return optuna.load_study(study_name=name, storage=storage).trials


@pytest.mark.slow
def test_hundreds_of_tiny_trials_finish_with_flat_driver_memory(tmp_path, data_cache):
    args = ["seed=range(0,200)", "train.max_steps=1", "train.eval_every=1", "train.probe_every=0",
            "train.eval_tokens=128", "train.per_token_eval_tokens=0", "wandb.mode=disabled", "name=many"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache)}
    driver = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), "-m", *TINY_SWEEP, *args], cwd=tmp_path,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    trials = tmp_path / "sweeps" / "many" / "trials"
    samples = []  # (finished trials, driver RSS in kB, read from /proc: no psutil needed)
    while driver.poll() is None:
        try:
            status = Path(f"/proc/{driver.pid}/status").read_text()
        except FileNotFoundError:
            break
        rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
        if rss is None:  # the driver has exited and is not yet reaped: a zombie has no memory lines
            continue
        samples.append((len(list(trials.glob("*/result.json"))), rss))
        # Trials this tiny finish ~10 a second: a slower sampler can step over a whole window.
        time.sleep(0.2)
    assert driver.returncode == 0, driver.stderr.read()[-3000:]
    assert len(pd.read_parquet(tmp_path / "sweeps" / "many" / "results.parquet")) == 200
    early = [rss for n, rss in samples if 30 <= n <= 60]
    late = [rss for n, rss in samples if n >= 150]
    assert early and late, sorted({n for n, _ in samples})
    # Flat: the driver holds no per-trial state that grows (allow 25% for allocator noise).
    assert max(late) < 1.25 * max(early), (max(early) / 1024, max(late) / 1024)  # MB


def test_a_trial_whose_worker_died_before_training_keeps_its_row(tmp_path):
    """No trial.json (the worker never reached run_trial): the row comes from the planned
    config in sweep.json, with the failure the study recorded."""
    from smallinit.sweeper.results.results import build_table

    trial = grid_trials("moe")[1][0]
    folder = tmp_path / "trials" / trial.identity()
    atomic_write_json(folder / "sweep.json", {"params": {"init.gamma": 0.5}, "overrides": ["init.gamma=0.5"],
                                              "identity": trial.identity(), "config": trial.to_dict()})
    reason = "the Ray worker crashed and retries were exhausted"
    df = build_table(tmp_path, {trial.identity(): {"number": 0, "state": "FAIL", "fail_reason": reason}})
    assert len(df) == 1
    row = df.iloc[0]
    assert row["state"] == "FAIL" and row["fail_reason"] == reason and row["swept"] == "init.gamma"
    assert row["config/model.preset"] == "micro-moe" and row["config/init.gamma"] == trial.model.init.gamma


def _open_at(url: str, start: float, results) -> None:
    from smallinit.sweeper.study.study import open_storage

    while time.time() < start:  # all openers hit the new file in the same instant
        pass
    try:
        open_storage(url)
        results.put("ok")
    except Exception as e:  # noqa: BLE001
        results.put(repr(e))


@pytest.mark.slow  # make test stays under 10 min on 2 cores; CI runs it after
def test_sweeps_creating_one_new_sqlite_storage_at_once_all_open_it(tmp_path):
    """Without a retry, 4 openers of a fresh file lose the schema race (`table studies already
    exists`, `UNIQUE constraint failed: alembic_version`) in most rounds."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    for round_ in range(2):
        url = f"sqlite:///{tmp_path / f'shared{round_}.db'}"
        results = ctx.Queue()
        start = time.time() + 4  # after the spawned interpreters have imported optuna
        procs = [ctx.Process(target=_open_at, args=(url, start, results)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [results.get(timeout=5) for _ in procs] == ["ok"] * 4


def test_wandb_run_ids_are_stable_per_folder_and_distinct_between_folders_and_machines(tmp_path, monkeypatch):
    from smallinit.sweeper.worker import trainable

    a = trainable.wandb_run_id("exp:1#a?b", "0123456789ab", str(tmp_path / "a" / "trials" / "x"))
    assert a == trainable.wandb_run_id("exp:1#a?b", "0123456789ab", str(tmp_path / "a" / "trials" / "x"))
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", a) and "0123456789ab" in a
    assert a != trainable.wandb_run_id("exp:1#a?b", "0123456789ab", str(tmp_path / "b" / "trials" / "x"))
    monkeypatch.setattr(trainable.socket, "gethostname", lambda: "another-machine")
    assert a != trainable.wandb_run_id("exp:1#a?b", "0123456789ab", str(tmp_path / "a" / "trials" / "x"))
    assert len(trainable.wandb_run_id("n" * 300, "0123456789ab", str(tmp_path))) <= 64
