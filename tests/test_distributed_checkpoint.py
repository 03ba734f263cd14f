"""The sharded checkpoint of a trial trained by several workers (checkpoint.dcp/, written by
trainer/checkpoint.py through torch.distributed.checkpoint): a kill at any step of a save leaves
the old or the new checkpoint whole, a damaged one is set aside, and through Ray Train a worker
killed with SIGKILL mid-trial costs only the steps since the last checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch

from smallinit.core.trial_dir import TrialDir
from smallinit.trainer.checkpoint import SCALARS, commit_sharded, read_sharded
from smallinit.trainer.loop import run_trial

from .conftest import REPO, TINY


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no handler catches it."""


def _shards(folder: TrialDir, step: int) -> None:
    """What write_shard leaves in checkpoint.dcp.new/, from one process: a tensor holding step."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: DCP says so
        dcp.save({"model": {"w": torch.full((64,), float(step))}}, checkpoint_id=folder.checkpoint_dcp_new)


def _save(folder: TrialDir, step: int) -> None:
    _shards(folder, step)
    commit_sharded(folder, {"identity": "t", "step": step})


def _step_on_disk(folder: TrialDir) -> int:
    """The step that read_sharded finds, checked against the tensor DCP loads beside it."""
    import torch.distributed.checkpoint as dcp

    scalars = read_sharded(folder, "t", log=lambda *_: None)
    state = {"model": {"w": torch.zeros(64)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=folder.checkpoint_dcp)
    assert torch.equal(state["model"]["w"], torch.full((64,), float(scalars["step"])))
    return scalars["step"]


def _kill_at(monkeypatch, n: int) -> None:
    """Raise Killed at the n-th change to the file system (a rename, a replace, a tree removed)."""
    calls = iter(range(1_000))

    def wrap(fn):
        def call(*args, **kwargs):
            if next(calls) == n:
                raise Killed
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(os, "replace", wrap(os.replace))  # core.files.atomic_write's last step
    monkeypatch.setattr(Path, "rename", wrap(Path.rename))
    monkeypatch.setattr(shutil, "rmtree", wrap(shutil.rmtree))


def test_a_kill_at_any_step_of_a_save_leaves_the_old_or_the_new_checkpoint_whole(tmp_path, monkeypatch):
    seen = set()
    for n in range(6):  # every file system change of commit_sharded, and one past its end
        folder = TrialDir(tmp_path / str(n))
        _save(folder, 10)
        _shards(folder, 20)
        with monkeypatch.context() as m:
            _kill_at(m, n)
            try:
                commit_sharded(folder, {"identity": "t", "step": 20})
            except Killed:
                pass
        seen.add(_step_on_disk(folder))
        assert sorted(p.name for p in folder.path.iterdir()) == ["checkpoint.dcp"], n
    assert seen == {10, 20}
    folder = TrialDir(tmp_path / "cut")  # killed while the shards were written: no scalars yet
    _save(folder, 10)
    _shards(folder, 20)
    assert _step_on_disk(folder) == 10 and not folder.checkpoint_dcp_new.exists()


@pytest.mark.parametrize("damage", ["shard cut off", "no metadata", "scalars not JSON"])
def test_a_damaged_sharded_checkpoint_is_set_aside(tmp_path, damage):
    folder = TrialDir(tmp_path)
    _save(folder, 10)
    path = folder.checkpoint_dcp
    if damage == "shard cut off":
        (shard,) = path.glob("*.distcp")
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "no metadata":
        (path / ".metadata").unlink()
    else:
        (path / SCALARS).write_text('{"identity": "t", "st')
    said = []
    assert read_sharded(folder, "t", log=said.append) is None
    (aside,) = tmp_path.glob("checkpoint.dcp.corrupt-*")
    assert not path.exists() and (aside / ".metadata").exists() is (damage != "no metadata")
    assert len(said) == 1 and said[0].startswith(f"{path} is unreadable (")
    assert said[0].endswith(f"); set aside as {aside.name}, training from step 0")


def test_a_sharded_checkpoint_of_another_trial_is_refused(tmp_path):
    folder = TrialDir(tmp_path)
    _save(folder, 10)
    with pytest.raises(RuntimeError, match=f"^{folder.checkpoint_dcp} belongs to trial t, not u: use another"):
        read_sharded(folder, "u")


# 24 steps: past them 2 workers' losses leave one process's by more than 1e-5 (float summation
# order, then a loss spike: 1e-7 relative at step 25, 3e-5 at 30, 1e-2 by 45). An evaluation at every step makes the 20 steps after the first
# checkpoint last long enough for the kill to land among them, even on an idle machine.
KILL_STEPS = ["train.max_tokens=null", "train.max_steps=24", "train.log_every=1", "train.eval_every=1",
              "train.eval_tokens=8192", "train.probe_every=0", "train.ckpt_every=4", "train.dtype=fp32",
              "train.parallel=fsdp"]


def _rank1_pid(folder: TrialDir) -> int | None:
    found = re.findall(r"\[rank 1\] rank 1/2 of trial \w+, pid (\d+)", folder.log.read_text()) if folder.log.exists() else []
    return int(found[-1]) if found else None


@pytest.mark.slow  # Ray started twice: about 6 minutes on 2 loaded cores (roughly 2 on idle ones)
def test_a_worker_killed_mid_trial_resumes_from_the_sharded_checkpoint(tmp_path, data_cache, trial_config):
    """The real CLI, a trial of 2 Ray Train workers (gloo, 1 CPU each, fsdp): SIGKILL to rank 1
    once checkpoint.dcp exists; the rerun resumes from it, the trial ends once, and its losses
    are those of the same settings trained by one process without a kill (24 steps: before they part)."""
    args = [sys.executable, str(REPO / "sweep.py"), "-m", *TINY, *KILL_STEPS, "ray.num_cpus=2", "ray.workers_per_trial=2",
            "hydra.sweeper.asha.enabled=false", "name=kill"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache)}
    sweep_dir = tmp_path / "sweeps" / "kill"
    driver = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, pid = time.time() + 300, None
    while pid is None and time.time() < deadline and driver.poll() is None:
        trials = TrialDir.all_in_sweep(sweep_dir)
        if trials and trials[0].checkpoint_dcp.exists():
            pid = _rank1_pid(trials[0])
        time.sleep(0.05)
    assert pid is not None, driver.communicate()[1][-3000:]
    assert b"ray::" in Path(f"/proc/{pid}/cmdline").read_bytes()  # a Ray worker, not a reused pid
    os.kill(pid, signal.SIGKILL)
    driver.communicate(timeout=600)
    (folder,) = TrialDir.all_in_sweep(sweep_dir)
    assert not folder.finished, "the trial ended before the kill: make it longer"
    failure = folder.read_failure()  # the dead rank's error, not its peer's lost connection
    assert failure["kind"] == "transient" and failure["reason"].startswith("a worker of the trial died (ActorDiedError"), failure["reason"]
    rerun = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    log = folder.log.read_text()
    resumed = [int(k) for k in re.findall(rf"\[rank 0\] resuming {folder.identity} from step (\d+)/24", log)]
    assert len(resumed) == 1 and resumed[0] > 0 and resumed[0] % 4 == 0, log[-3000:]
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(df) == 1 and df["state"][0] == "COMPLETE"
    study = optuna.load_study(study_name="kill", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    assert [t.state for t in study.trials].count(optuna.trial.TrialState.COMPLETE) == 1
    assert not folder.checkpoint_dcp.exists() and folder.model_weights.exists()

    one = tmp_path / "one"
    trial = trial_config(*KILL_STEPS)
    reference = run_trial(trial, one, log=lambda *_: None)  # 24 steps: 2 workers' losses are still one process's
    assert folder.identity == trial.identity(2) != reference.identity  # the worker count is part of the identity
    rows = [json.loads(line) for line in folder.metrics.read_text().splitlines()]
    ref = [json.loads(line) for line in TrialDir(one).metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in ref]  # rows after the checkpoint written once
    for a, b in zip(ref, rows, strict=True):
        for key in ("train/loss", "val/loss"):
            if a.get(key) is not None:
                assert b[key] == pytest.approx(a[key], rel=1e-5), (a["step"], key)
    assert df["final_val_loss"][0] == pytest.approx(reference.final_val_loss, rel=1e-5)
