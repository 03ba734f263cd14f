"""What a sweep says about W&B: one line as the first trials start (mode, project, where the run
files go), and at the end the `wandb sync` command for the offline runs, which must work as
printed. A mistyped wandb.mode is refused before launch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from smallinit.core.errors import ConfigError
from smallinit.sweeper.config.schema import check_wandb
from smallinit.sweeper.results.summary import wandb_line, wandb_sync_line

from .conftest import error_line, sweep


@pytest.fixture
def no_key(monkeypatch, tmp_path):
    """No W&B key anywhere: not in the environment, no ~/.netrc."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_the_start_line_names_the_mode_the_project_and_the_folder(no_key, monkeypatch):
    sweep_dir = Path("/data/sweeps/g")
    line = wandb_line({"mode": "auto"}, sweep_dir, "g")
    assert line.startswith("W&B: offline (wandb.mode=auto: no WANDB_API_KEY or `wandb login`), project smallinit, "
                           "group g, run files in /data/sweeps/g/trials/<identity>/wandb")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_line({"mode": "auto", "project": "p", "entity": "team"}, sweep_dir, "g").startswith(
        "W&B: online (wandb.mode=auto: a W&B key is set), project team/p, group g")
    assert wandb_line({"mode": "offline"}, sweep_dir, "g").startswith("W&B: offline (wandb.mode=offline), ")
    assert wandb_line({"mode": "disabled"}, sweep_dir, "g") == (
        "W&B: disabled (wandb.mode=disabled); each trial's metrics are in /data/sweeps/g/trials/<identity>/metrics.jsonl")


def test_the_sync_line_counts_runs_not_uploaded_and_quotes_the_folder(tmp_path):
    sweep_dir = tmp_path / "my sweeps" / "g"
    assert wandb_sync_line(sweep_dir) is None
    for trial, run in (("a", "offline-run-20260101_000000-x"), ("b", "offline-run-20260101_000001-y")):
        (sweep_dir / "trials" / trial / "wandb" / run).mkdir(parents=True)
    (sweep_dir / "trials" / "b" / "wandb" / "offline-run-20260101_000001-y" / "run-y.wandb.synced").touch()
    assert wandb_sync_line(sweep_dir) == (f"W&B: 1 offline run not uploaded yet; upload with: wandb sync "
                                          f"'{sweep_dir}'/trials/*/wandb/offline-run-*")


def test_a_mistyped_mode_is_refused_in_one_line():
    for mode in ("auto", "online", "offline", "disabled"):
        check_wandb({"mode": mode})
    with pytest.raises(ConfigError, match=r"^wandb.mode=ofline is invalid: must be one of auto, online, offline, "
                                          r"disabled$"):
        check_wandb({"mode": "ofline"})


@pytest.mark.slow
def test_an_offline_sweep_says_where_its_runs_go_and_how_to_upload_them(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5", "wandb.mode=offline", "name=wb")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "sweeps" / "wb"
    lines = proc.stdout.splitlines()
    start = [line for line in lines if line.startswith("W&B: offline")]
    assert start == [f"W&B: offline (wandb.mode=offline), project smallinit, group wb, run files in "
                     f"{sweep_dir}/trials/<identity>/wandb, to upload with `wandb sync` (the command is printed "
                     "at the end)"], proc.stdout[-3000:]
    sync = [line for line in lines if " not uploaded yet; upload with: " in line]
    assert len(sync) == 1 and lines.index(sync[0]) > lines.index(start[0]), proc.stdout[-3000:]
    command = sync[0].split("upload with: ")[1]
    assert command == f"wandb sync {sweep_dir}/trials/*/wandb/offline-run-*"
    # The command as printed, run by a shell (which expands the glob), finds the run; --dry-run
    # stops before it would upload.
    wandb_cli = Path(sys.executable).parent / "wandb"
    dry = subprocess.run(["bash", "-c", f"{wandb_cli} sync --dry-run {command.removeprefix('wandb sync ')}"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_API_KEY": ""})
    assert dry.returncode == 0 and "Would sync 1 run(s)" in dry.stdout + dry.stderr, dry.stdout + dry.stderr
    assert len(list(sweep_dir.glob("trials/*/wandb/offline-run-*/run-*.wandb"))) == 1

    # A rerun that trains nothing starts no trial (no start line) and still names the runs to upload.
    again = sweep(tmp_path, data_cache, "init.gamma=0.5", "wandb.mode=offline", "name=wb")
    assert again.returncode == 0 and "1 trials (1 already done)" in again.stdout, again.stderr[-3000:]
    assert "W&B: offline" not in again.stdout and sync[0] in again.stdout.splitlines()


def test_a_mistyped_mode_stops_the_sweep_before_anything_is_written(tmp_path, data_cache):
    proc = sweep(tmp_path, data_cache, "init.gamma=0.5", "wandb.mode=ofline", "name=typo")
    assert proc.returncode == 1
    assert error_line(proc) == "error: wandb.mode=ofline is invalid: must be one of auto, online, offline, disabled"
    assert not (tmp_path / "sweeps" / "typo").exists()
