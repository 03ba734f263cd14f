"""records/keep.py: a sweep's finished trials carried to a new folder read as finished there,
and neither side writes over what it did not write."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tarfile

import pytest

from records.keep import MANIFEST, pack, unpack
from smallinit.core.errors import ConfigError
from smallinit.core.trial_dir import TrialDir
from smallinit.trainer.loop import run_trial

from .conftest import TINY_SWEEP, StopAt, run_cli


@pytest.fixture
def sweep(trial_config, tmp_path, empty_study_db):
    """A sweep folder: one finished trial, one interrupted mid-run, a study, a protocol and a driver lock."""
    root = tmp_path / "mine"
    root.mkdir()
    shutil.copy(empty_study_db, root / "optuna.db")
    done, running = trial_config("train.keep_weights=false"), trial_config("train.keep_weights=false", "init.gamma=0.5")
    run_trial(done, TrialDir.in_sweep(root, done.identity()).path, log=lambda *_: None)
    with pytest.raises(KeyboardInterrupt):
        run_trial(running, TrialDir.in_sweep(root, running.identity()).path, reporter=StopAt(4), log=lambda *_: None)
    (root / "protocol.json").write_text('{"tune_seeds": [100]}\n')
    (root / "driver.lock").write_text("pid 1\n")
    return root, done.identity(), running.identity()


def test_a_packed_sweep_unpacks_into_its_finished_trials_and_study_records(sweep, tmp_path):
    root, done, running = sweep
    manifest = pack(root, tmp_path / "mine.tgz")
    assert (manifest["finished"], manifest["left"], manifest["sweep"]) == ([done], [running], "mine")
    with tarfile.open(tmp_path / "mine.tgz") as tar:
        names = tar.getnames()
    assert not any("checkpoint" in n or n.endswith(".lock") for n in names) and MANIFEST in names

    with pytest.raises(ConfigError, match="the pack holds sweep 'mine'; unpack it into a folder of that name"):
        unpack(tmp_path / "mine.tgz", tmp_path / "elsewhere")
    unpack(tmp_path / "mine.tgz", tmp_path / "there" / "mine")
    there = TrialDir.in_sweep(tmp_path / "there" / "mine", done)
    assert there.damaged_result() is None and there.read_result() == TrialDir.in_sweep(root, done).read_result()
    here = tmp_path / "there" / "mine"
    assert (here / "protocol.json").read_text() == '{"tune_seeds": [100]}\n'
    assert not (here / "driver.lock").exists() and not (here / MANIFEST).exists()
    with sqlite3.connect(here / "optuna.db") as db:  # the study, carried whole
        assert db.execute("pragma integrity_check").fetchone() == ("ok",)
        assert db.execute("select count(*) from studies").fetchone() is not None
    assert not TrialDir.in_sweep(here, running).path.exists()
    # The same finished trials again: the pack is not written again (a running study would churn it).
    before = (tmp_path / "mine.tgz").read_bytes()
    assert pack(root, tmp_path / "mine.tgz")["unchanged"] and (tmp_path / "mine.tgz").read_bytes() == before


def test_neither_side_writes_over_what_it_did_not_write(sweep, tmp_path, trial_config):
    root, done, _ = sweep
    out = tmp_path / "mine.tgz"
    pack(root, out)
    before = out.read_bytes()
    # A folder that has lost a finished trial the pack holds: the pack keeps it.
    TrialDir.in_sweep(root, done).result_json.unlink()
    with pytest.raises(ConfigError, match=r"holds 1 finished trial\(s\) that .* lacks"):
        pack(root, out)
    assert out.read_bytes() == before
    # Not a pack: refused, untouched.
    (tmp_path / "notes.tgz").write_text("my notes")
    with pytest.raises(ConfigError, match="not a pack written by records.keep"):
        pack(root, tmp_path / "notes.tgz")
    assert (tmp_path / "notes.tgz").read_text() == "my notes"
    # Into a folder that holds anything: refused before any write.
    full = tmp_path / "full" / "mine"
    full.mkdir(parents=True)
    (full / "x").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        unpack(out, full)
    assert [p.name for p in full.iterdir()] == ["x"]


def test_a_trial_that_kept_its_weights_is_named_and_left_out_not_the_whole_sweep(trial_config, tmp_path):
    heavy, light = trial_config(), trial_config("train.keep_weights=false", "init.gamma=0.5")
    for trial in (heavy, light):
        run_trial(trial, TrialDir.in_sweep(tmp_path / "s", trial.identity()).path, log=lambda *_: None)
    manifest = pack(tmp_path / "s", tmp_path / "s.tgz")
    assert manifest["finished"] == [light.identity()]
    assert "lists model.pt: trained with train.keep_weights=true" in manifest["not_carried"][heavy.identity()]


@pytest.mark.integration
def test_a_sweep_carried_to_a_new_folder_trains_nothing_again(tmp_path, data_cache):
    """The real CLI: finished trials packed, unpacked elsewhere, the same command there has nothing to run."""
    args = ["-m", *TINY_SWEEP, "init.gamma=0.5,1.0", "train.keep_weights=false", "wandb.mode=disabled", "name=far"]
    env = {"SMALLINIT_CACHE": str(data_cache)}
    first = run_cli([*args, f"hydra.sweep.dir={tmp_path / 'here' / 'far'}"], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    manifest = pack(tmp_path / "here" / "far", tmp_path / "far.tgz")
    assert len(manifest["finished"]) == 2
    unpack(tmp_path / "far.tgz", tmp_path / "there" / "far")
    again = run_cli([*args, f"hydra.sweep.dir={tmp_path / 'there' / 'far'}"], cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 trials (2 already done)" in again.stdout
    results = [json.loads((tmp_path / "there" / "far" / "trials" / i / "result.json").read_text()) for i in manifest["finished"]]
    assert all("model.pt" not in r["files"] for r in results)
