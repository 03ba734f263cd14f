"""Faults outside a trial heal on a rerun; a trial's own failure stays final; the trial
folders rebuild a lost study. Real sweeps (tiny configs, local Ray) and real faults."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess

import optuna
import pytest

from smallinit.core.files import atomic_write
from smallinit.sweeper.worker import failures

from .conftest import DIVERGES, result_mtimes, study_trials, sweep, table


def _torch_style_disk_full(f):
    """What torch.save does on a full disk: the OSError of the write underneath, re-raised as
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")."""
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None


def test_kinds_of_failure(tmp_path):
    from smallinit.trainer.loop import TrialDiverged

    path = tmp_path / "trials" / "abc" / "checkpoint.pt"
    with pytest.raises(OSError) as full:
        atomic_write(path, _torch_style_disk_full)
    kind, reason = failures.classify(full.value)
    assert kind == failures.TRANSIENT and reason.startswith(f"no space left on device: {path}")
    assert "inline_container" not in reason and list(path.parent.iterdir()) == []  # no temp file left

    import wandb.errors

    assert failures.classify(wandb.errors.CommError("connection refused"))[0] == failures.TRANSIENT
    assert failures.classify(TrialDiverged("diverged at step 3: loss=nan")) == (
        failures.PERMANENT, "TrialDiverged: diverged at step 3: loss=nan")
    assert failures.classify(ValueError("n_heads must divide d_model"))[0] == failures.PERMANENT
    assert failures.recorded_kind(None, {"fail_reason": failures.WORKER_CRASHED}) == failures.TRANSIENT
    assert failures.recorded_kind({"reason": "x"}, {}) is None  # from before kinds: the trial's own
    assert failures.retry_on_rerun(None, retry_failed=True) and not failures.retry_on_rerun(None, False)


@pytest.mark.slow  # ~35 s of real trials; `make test-full`
def test_a_divergence_stays_failed_unless_retry_failed(tmp_path, data_cache):
    first = sweep(tmp_path, data_cache, *DIVERGES, "name=nan")
    df = table(tmp_path, "nan")
    assert df["state"].tolist() == ["FAIL"] and "diverged at" in df["fail_reason"][0], first.stderr[-2000:]
    assert json.loads((tmp_path / "sweeps" / "nan" / df["trial_dir"][0] / "failure.json").read_text())["kind"] == "permanent"
    again = sweep(tmp_path, data_cache, *DIVERGES, "name=nan")
    assert "1 trials (1 already done)" in again.stdout, again.stdout + again.stderr[-2000:]
    forced = sweep(tmp_path, data_cache, *DIVERGES, "name=nan", "hydra.sweeper.retry_failed=true")
    assert "1 trials (0 already done)" in forced.stdout, forced.stdout + forced.stderr[-2000:]
    assert table(tmp_path, "nan")["state"].tolist() == ["FAIL"]
    assert "running again after: TrialDiverged" in (tmp_path / "sweeps" / "nan" / df["trial_dir"][0] / "trial.log").read_text()


@pytest.mark.slow
def test_a_bad_wandb_key_fails_the_trial_and_the_rerun_with_it_fixed_completes_it(tmp_path, data_cache):
    # wandb.mode=auto with a key is online; the "server" refuses connections, as with no network.
    broken = {"WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_INIT_TIMEOUT": "5"}
    sweep(tmp_path, data_cache, "init.gamma=0.5", "wandb.mode=auto", "name=wb", env=broken)
    df = table(tmp_path, "wb")
    assert df["state"].tolist() == ["FAIL"] and df["fail_reason"][0].startswith("W&B failed (CommError"), df["fail_reason"][0]
    fixed = sweep(tmp_path, data_cache, "init.gamma=0.5", "wandb.mode=auto", "name=wb")  # no key: offline
    assert fixed.returncode == 0 and "1 trials (0 already done)" in fixed.stdout, fixed.stderr[-3000:]
    df = table(tmp_path, "wb")
    assert df["state"].tolist() == ["COMPLETE"] and df["fail_reason"].isna().all()
    assert not (tmp_path / "sweeps" / "wb" / df["trial_dir"][0] / "failure.json").exists()


def _mount_tmpfs(path, size: str) -> bool:
    path.mkdir(parents=True)
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.slow  # ~35 s of real trials; `make test-full`
def test_a_full_disk_names_the_file_and_the_rerun_after_freeing_space_completes_the_trial(tmp_path, data_cache,
                                                                                         trial_config):
    args = ["init.gamma=0.5", "train.probe_every=0", "wandb.mode=disabled", "name=full"]
    folder = tmp_path / "sweeps" / "full" / "trials" / trial_config(*args[:2]).identity()
    # 1 MB holds the trial's JSON and logs, not its ~11 MB checkpoint.
    if not _mount_tmpfs(folder, "1m"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        sweep(tmp_path, data_cache, *args)
        df = table(tmp_path, "full")
        assert df["state"].tolist() == ["FAIL"] and df["trial_dir"][0] == f"trials/{folder.name}"
        assert df["fail_reason"][0].startswith(f"no space left on device: {folder / 'checkpoint.pt'}")
        subprocess.run(["mount", "-o", "remount,size=64m", str(folder)], check=True)  # space freed
        again = sweep(tmp_path, data_cache, *args)
        assert again.returncode == 0 and "1 trials (0 already done)" in again.stdout, again.stderr[-3000:]
        df = table(tmp_path, "full")
        assert df["state"].tolist() == ["COMPLETE"] and df["fail_reason"].isna().all()
    finally:
        subprocess.run(["umount", "-l", str(folder)])


def _chattr(flag: str, *paths) -> bool:
    return shutil.which("chattr") is not None and subprocess.run(["chattr", flag, *map(str, paths)],
                                                                   capture_output=True).returncode == 0


@pytest.mark.slow  # two sweeps of one trial; `make test-full`
@pytest.mark.parametrize("what", ["results.parquet", "trials", "a trial folder holding a damaged result.json"])
def test_a_write_the_system_refuses_is_one_line_naming_the_path(tmp_path, data_cache, what):
    """An immutable results table, an immutable trials/ that a grown grid must add a folder to,
    or an immutable trial folder whose damaged result.json must be set aside: the rerun ends in
    one line naming the path and what to do; the finished trial is kept."""
    first = sweep(tmp_path, data_cache, "init.gamma=0.5", "wandb.mode=disabled", "name=ro")
    assert first.returncode == 0, first.stderr[-3000:]
    target = tmp_path / "sweeps" / "ro" / what
    named = target
    if what.startswith("a trial folder"):
        target = next((tmp_path / "sweeps" / "ro" / "trials").iterdir())
        (target / "result.json").write_text("{")  # cut off: the driver sets it aside, renaming it in the folder
        named = target / "result.json.corrupt-"
    if not _chattr("+i", target):
        pytest.skip("chattr +i needs root on a file system that has it")
    try:
        again = sweep(tmp_path, data_cache, "init.gamma=0.5,1.0", "wandb.mode=disabled", "name=ro")
    finally:
        _chattr("-i", target)
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr[-3000:]
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write {named}") and "(Operation not permitted): make it writable" in last
    assert last.endswith("rerun the same command; what finished is kept")


@pytest.mark.slow
def test_an_unreadable_checkpoint_is_set_aside_and_the_trial_trains_from_scratch(tmp_path, data_cache, trial_config):
    import torch

    args = ["init.gamma=0.5", "wandb.mode=disabled", "name=trunc"]
    folder = tmp_path / "sweeps" / "trunc" / "trials" / trial_config(args[0]).identity()
    folder.mkdir(parents=True)
    torch.save({"identity": folder.name, "model": torch.zeros(10_000)}, folder / "checkpoint.pt")
    data = (folder / "checkpoint.pt").read_bytes()
    (folder / "checkpoint.pt").write_bytes(data[: len(data) // 2])  # cut off, as by a full disk or a copy
    proc = sweep(tmp_path, data_cache, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert table(tmp_path, "trunc")["state"].tolist() == ["COMPLETE"]
    aside = list(folder.glob("checkpoint.pt.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == data[: len(data) // 2]  # kept, untouched
    assert "is unreadable" in (folder / "trial.log").read_text()
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] == 0 and steps == sorted(set(steps))


@pytest.mark.slow
def test_a_deleted_study_is_rebuilt_from_the_trial_folders(tmp_path, data_cache):
    grid = ["init.gamma=0.5,1.0", "optim.lr=1e-3,1e12", "optim.grad_clip=null", "optim.warmup_frac=0",
            "wandb.mode=disabled", "name=lost"]
    first = sweep(tmp_path, data_cache, *grid)
    sweep_dir = tmp_path / "sweeps" / "lost"
    before, table_before = result_mtimes(sweep_dir), table(tmp_path, "lost").set_index("identity")
    assert len(before) == 2 and (table_before["state"] == "FAIL").sum() == 2, first.stderr[-2000:]
    (sweep_dir / "optuna.db").unlink()
    again = sweep(tmp_path, data_cache, *grid)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "recorded 4 ended trials" in again.stdout and "4 trials (4 already done)" in again.stdout
    assert result_mtimes(sweep_dir) == before  # nothing trained twice
    after = table(tmp_path, "lost").set_index("identity")
    assert after["state"].to_dict() == table_before["state"].to_dict()
    assert after["fail_reason"].fillna("").to_dict() == table_before["fail_reason"].fillna("").to_dict()
    trials = study_trials(sweep_dir, "lost")
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "COMPLETE", "FAIL", "FAIL"]
    assert all(len(t.intermediate_values) >= 2 for t in trials if t.state == optuna.trial.TrialState.COMPLETE)


def test_a_corrupt_study_file_is_named_in_one_line(tmp_path, data_cache):
    db = tmp_path / "sweeps" / "bad" / "optuna.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database, just bytes " * 100)
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5", "wandb.mode=disabled", "name=bad")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: sweeps/bad/optuna.db is not a readable SQLite study: "), proc.stderr[-2000:]
    assert lines[-1].endswith("move it aside and rerun to rebuild it from the trial folders")
    assert "hydra.sweeper.storage" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "sweeps" / "bad" / "trials").exists()


def test_a_full_disk_while_the_study_is_created_says_so_not_corrupt(tmp_path):
    from smallinit.core.errors import ConfigError
    from smallinit.sweeper.study.study import open_storage

    folder = tmp_path / "full"
    if not _mount_tmpfs(folder, "64k"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (folder / "fill").write_bytes(b"\0" * 65536)
        with pytest.raises(ConfigError) as e:
            open_storage(f"sqlite:///{folder / 'optuna.db'}")
        assert str(e.value) == (f"no space left on device: {folder / 'optuna.db'} (the study could not be written; "
                                "free space and rerun the same command)")
    finally:
        subprocess.run(["umount", "-l", str(folder)])


def test_a_full_disk_at_the_sweeps_end_is_one_line_and_keeps_the_finished_trials(tmp_path, monkeypatch):
    """The driver's last writes (the results table) on a full disk: one line saying what is kept
    and what to do, not pyarrow's 60-line traceback. (Seen for real with the sweep folder on a
    4300k tmpfs: the trial's model.pt fitted, results.parquet did not.)"""
    import pandas as pd

    from smallinit.sweeper import driver
    from smallinit.sweeper.results.results import write_table

    folder = tmp_path / "full"
    if not _mount_tmpfs(folder, "64k"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (folder / "fill").write_bytes(b"\0" * 60000)
        table_rows = pd.DataFrame({"trial_id": range(20000), "loss": [1.5] * 20000})
        monkeypatch.setattr(driver, "_run", lambda *a: write_table(folder, table_rows))
        with pytest.raises(SystemExit) as stopped:
            driver.run_sweep(None, None, None, [])
        message = str(stopped.value.code)
        assert message == (f"error: no space left on device: {folder / 'results.parquet'}; the trials that finished "
                           "are kept in their folders: free some space and rerun the command (it trains only "
                           "what did not finish and writes the table again)")
        assert not (folder / "results.parquet").exists()  # no half-written table left to be read
    finally:
        subprocess.run(["umount", "-l", str(folder)])


@pytest.mark.slow  # ~40 s: a real sweep whose trial folder is removed while it trains
def test_a_trial_folder_removed_while_it_trains_fails_with_its_reason_and_the_rerun_trains_it(tmp_path, data_cache):
    """rm -rf of a running trial's folder: the trial stops at its next checkpoint or its end
    (it must not write a result nobody can read into a folder it recreated), the sweep exits 1
    with the reason on its row, and the rerun trains the trial again."""
    import os
    import sys
    import time

    from .conftest import REPO, TINY_SWEEP

    args = ["-m", *TINY_SWEEP, "init.gamma=1.0", "train.max_tokens=16384", "train.eval_every=16",
            "train.ckpt_every=8", "train.probe_every=0", "wandb.mode=disabled", "name=removed"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), str(REPO)]), "SMALLINIT_CACHE": str(data_cache), "WANDB_API_KEY": ""}
    driver = subprocess.Popen([sys.executable, str(REPO / "sweep.py"), *args], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trials = tmp_path / "sweeps" / "removed" / "trials"
    deadline, removed = time.time() + 300, None
    while time.time() < deadline and driver.poll() is None and removed is None:
        for checkpoint in trials.glob("*/checkpoint.pt"):
            removed = checkpoint.parent
            # rm -rf in one step: rmtree alone races the trial's next write (ENOTEMPTY in CI)
            removed.rename(tmp_path / "trial_removed")
            shutil.rmtree(tmp_path / "trial_removed")
        time.sleep(0.2)
    assert removed is not None, "the trial never checkpointed"
    out, err = driver.communicate(timeout=600)
    assert driver.returncode == 1 and "Traceback" not in out + err, err[-3000:]
    reason = (f"{removed} was removed or replaced while the trial trained (its trial.json is gone): this run's "
              "work is not kept; rerun the command to train the trial again")
    assert f"failed (1 trial): {reason}\n" in out
    df = table(tmp_path, "removed")
    assert df["state"].tolist() == ["FAIL"] and df["fail_reason"].tolist() == [reason]
    again = sweep(tmp_path, data_cache, *args[1 + len(TINY_SWEEP):])
    assert again.returncode == 0 and "1 new" in again.stdout, again.stderr[-3000:]
    assert table(tmp_path, "removed")["state"].tolist() == ["COMPLETE"]


def test_a_row_whose_folder_lost_its_settings_takes_the_swept_values_from_the_study(tmp_path):
    from smallinit.core.trial_dir import TrialDir
    from smallinit.sweeper.results.results import build_table

    folder = TrialDir.in_sweep(tmp_path, "0123456789ab")
    folder.write_failure("the folder was removed while the trial trained", "", failures.TRANSIENT)
    df = build_table(tmp_path, {"0123456789ab": {"number": 3, "state": "FAIL", "params": {"init.gamma": 1.0}}})
    assert df["config/init.gamma"].tolist() == [1.0] and df["trial_number"].tolist() == [3]
    assert df["swept"].tolist() == ["init.gamma"]
    assert df["fail_reason"].tolist() == ["the folder was removed while the trial trained"]


def test_a_study_whose_trials_table_was_dropped_is_named_in_one_line_not_recreated_empty(tmp_path):
    import sqlite3

    from smallinit.core.errors import ConfigError
    from smallinit.sweeper.study.study import open_storage

    db = tmp_path / "optuna.db"
    study = optuna.create_study(storage=f"sqlite:///{db}", study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA foreign_keys = OFF")
        con.execute("DROP TABLE trials")
    with pytest.raises(ConfigError, match=r"optuna.db is not a readable SQLite study: it has no trials table; move it aside"):
        open_storage(f"sqlite:///{db}")
    with sqlite3.connect(db) as con:  # refused before Optuna could write the table back
        assert "trials" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
