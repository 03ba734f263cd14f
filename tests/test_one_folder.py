"""One trial folder is never trained by two workers: grids whose points share an identity are
refused before anything is written, `name` is never an axis, and a worker finding a trial
folder's lock held does not train it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from smallinit.core.trial_lock import TrialBusy, trial_lock

from .conftest import REPO, TINY, run_cli


@pytest.mark.parametrize("args, message", [
    (["init.gamma=1.0", "train.threads=1,2"],
     "train.threads=1,2 is invalid in a sweep: train.threads is not part of a trial's identity"),
    (["init.gamma=0.5,1.0", "name=x,y"], "name=x,y is invalid: name is the sweep's one folder"),
])
def test_a_grid_that_would_train_one_folder_twice_is_refused_before_anything_is_written(tmp_path, data_cache,
                                                                                         args, message):
    swept = {a.split("=", 1)[0] for a in args}  # the test's own key replaces TINY's (a swept key is given once)
    proc = run_cli(["-m", *(t for t in TINY if t.split("=", 1)[0] not in swept), *args], cwd=tmp_path,
                   env={"SMALLINIT_CACHE": str(data_cache)})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {message}")
    assert not (tmp_path / "sweeps").exists()


def test_a_second_worker_on_a_locked_trial_folder_is_refused_at_once(tmp_path):
    lock = tmp_path / "trial.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO / 'src')!r})
        from smallinit.core.trial_lock import trial_lock
        with trial_lock(__import__("pathlib").Path({str(lock)!r})):
            print("held", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TrialBusy, match=f"pid {holder.pid}"), trial_lock(lock):
            pass
    finally:
        holder.kill()
        holder.wait()
    with trial_lock(lock):  # the kernel dropped the dead holder's lock
        pass


def test_a_single_run_into_a_folder_another_run_trains_is_refused_at_once(tmp_path, data_cache):
    """`sweep.py ... hydra.run.dir=<folder>` resumes a run; a second such command while the first
    trains holds no lock and would train the folder with it: it stops in one line instead."""
    folder = tmp_path / "run"
    folder.mkdir()
    with trial_lock(folder / "trial.lock"):  # the first run, holding the folder
        proc = run_cli([*TINY, f"hydra.run.dir={folder}"], cwd=tmp_path, env={"SMALLINIT_CACHE": str(data_cache)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "another worker is training this trial folder" in proc.stderr.strip().splitlines()[-1]
    assert not (folder / "metrics.jsonl").exists()  # nothing trained


def test_a_single_run_into_another_trials_or_a_damaged_folder_is_one_line(tmp_path, data_cache):
    env = {"SMALLINIT_CACHE": str(data_cache)}
    folder = tmp_path / "run"
    first = run_cli([*TINY, "init.gamma=0.5", f"hydra.run.dir={folder}"], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    written = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    other = run_cli([*TINY, "init.gamma=1.0", "optim.lr=0.01", f"hydra.run.dir={folder}"], cwd=tmp_path, env=env)
    assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr[-2000:]
    assert other.stderr.strip().splitlines()[-1].startswith(f"error: hydra.run.dir={folder}: {folder} holds finished trial")
    again = run_cli([*TINY, "init.gamma=0.5", f"hydra.run.dir={folder}"], cwd=tmp_path, env=env)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stderr[-2000:]
    # Refused or finished, the folder is as the first run left it: Hydra's .hydra/ included.
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == written
    (folder / "result.json").write_text("{cut")
    damaged = run_cli([*TINY, "init.gamma=0.5", f"hydra.run.dir={folder}"], cwd=tmp_path, env=env)
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr
    assert damaged.stderr.strip().splitlines()[-1].startswith(f"error: {folder / 'result.json'} is damaged (")


def test_a_refused_single_run_leaves_no_folder_behind(tmp_path, data_cache):
    """The config, the allocator switch and the corpus against the budget are checked before Hydra
    makes the run's folder: a refusal is one line and writes nothing (no runs/<name>/<time>/)."""
    env = {"SMALLINIT_CACHE": str(data_cache)}
    proc = run_cli([*TINY, "init.gamma=-1"], cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: init.gamma=-1")
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    proc = run_cli([*TINY, f"hydra.run.dir={a_file}"], cwd=tmp_path, env=env)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == \
        f"error: hydra.run.dir={a_file} is invalid: it is a file, not a folder (nothing was written)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and a_file.read_text() == "mine"


def test_a_single_run_into_a_folder_of_a_users_files_or_another_unfinished_trial_writes_nothing(tmp_path, data_cache):
    env = {"SMALLINIT_CACHE": str(data_cache)}
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "metrics.jsonl").write_text('{"step": 0}\n')
    proc = run_cli([*TINY, f"hydra.run.dir={folder}"], cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (f"error: hydra.run.dir={folder} holds files no trial wrote "
                                                    "(metrics.jsonl, notes.txt): a run trains into a new or empty "
                                                    "folder, or its own trial's (nothing was written)")
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl", "notes.txt"]
    # Another trial began here and stopped before its first checkpoint: still its folder.
    other = tmp_path / "other"
    other.mkdir()
    (other / "trial.json").write_text(json.dumps({"identity": "0123456789abcdef", "config": {}}))
    (other / "metrics.jsonl").write_text('{"step": 0}\n')
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    proc = run_cli([*TINY, f"hydra.run.dir={other}"], cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: hydra.run.dir={other}: {other} holds trial 0123456789abcdef, not ")
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before  # no .hydra/, nothing unlinked


@pytest.mark.slow  # two sweeps of one trial; `make test-full`
def test_two_folders_on_one_study_started_seconds_apart_train_an_identity_once(tmp_path, data_cache):
    """The first driver claims its grid's trials in the study before Ray starts, so a second one
    started as soon as the first has planned (long before any trial checkpoints) leaves them, says
    so, and counts none of them as done."""
    import os
    import time

    import optuna

    from .conftest import TINY_SWEEP, sweep

    db = tmp_path / "team.db"
    args = ["init.gamma=0.5", "train.max_tokens=16384", "train.probe_every=0", "wandb.mode=disabled",
            f"hydra.sweeper.storage=sqlite:///{db}", "hydra.sweeper.study_name=team"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache),
           "WANDB_API_KEY": ""}
    first = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), "-m", *TINY_SWEEP, *args, "name=a"], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.time() + 120
    while time.time() < deadline and not any(line.startswith("sweep team: grid") for line in lines):
        lines.append(first.stdout.readline())
    assert any("(0 already done); to run: 0 resume from a checkpoint, 1 new" in line for line in lines), lines
    second = sweep(tmp_path, data_cache, *args, "name=b")
    out = first.communicate(timeout=600)[0]
    assert first.returncode == 0, out[-3000:]
    assert second.returncode == 0 and "Traceback" not in second.stdout + second.stderr, second.stderr[-3000:]
    assert "study: 1 trial of this sweep is being trained by another sweep's driver" in second.stdout
    assert "grid, 1 trials (0 already done, 1 being trained by another sweep); nothing to run" in second.stdout
    assert not list(tmp_path.glob("sweeps/b/trials/*/result.json"))  # not trained twice
    trials = optuna.load_study(study_name="team", storage=f"sqlite:///{db}").get_trials(deepcopy=False)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE]
