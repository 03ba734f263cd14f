"""Every file a finished trial keeps, every reader, every way a file goes wrong: another trial's
copy, cut short, emptied, deleted. Each reader names the file in one line and does what it does
for a damaged result.json: the results table reports the trial FAIL with the reason, the report
leaves it out of every verdict and says so, export refuses (its own two files), the sweep driver
sets the trial aside and trains it again (tests/test_reconcile.py runs that end to end). The
lists below are checked against what a trial writes, so a new kind of file cannot escape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from smallinit.core import trial_files
from smallinit.core.errors import ConfigError
from smallinit.core.trial_dir import TrialDir

from .conftest import CONF, TINY

pytestmark = pytest.mark.integration

KINDS = [".hydra/config.yaml", ".hydra/overrides.yaml", "sweep.json", "trial.json", "metrics.jsonl",
         "per_token_losses.npz", "probes/step_0000002.npz", "model.pt"]
DAMAGES = ["another trial's copy", "cut short", "zero bytes", "deleted"]
EXPORT_READS = ("trial.json", "model.pt")


def _compose(*overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=[*TINY, *overrides]), resolve=True)


@pytest.fixture(scope="module")
def pristine(data_cache, tmp_path_factory) -> tuple[Path, Path]:
    """Two finished trials of one sweep folder, each with the files a sweep's trial has."""
    from smallinit.trainer.config import trial_config_from_dict
    from smallinit.trainer.loop import run_trial

    sweep = tmp_path_factory.mktemp("files") / "sweep"
    folders = []
    for gamma in ("0.5", "1.0"):
        overrides = ["train.max_tokens=256", f"init.gamma={gamma}"]
        trial = trial_config_from_dict(_compose(*overrides))
        folder = TrialDir.in_sweep(sweep, trial.identity())
        folder.hydra_config.parent.mkdir(parents=True)
        folder.hydra_config.write_text(json.dumps(_compose(*overrides)))  # YAML reads JSON
        folder.hydra_overrides.write_text(json.dumps(overrides))
        folder.write_sweep_plan({"init.gamma": float(gamma)}, overrides, trial.identity(), trial.to_dict())
        run_trial(trial, folder.path, log=lambda *_: None)
        folders.append(folder.path)
    return folders[0], folders[1]


def test_a_finished_trial_lists_every_file_it_keeps(pristine):
    folder, _ = pristine
    listed = json.loads((folder / "result.json").read_text())[trial_files.KEY]
    assert set(KINDS) <= set(listed) and set(listed) == set(trial_files.kept(folder))
    assert all(set(v) == {"bytes", "sha256"} for v in listed.values())
    assert TrialDir(folder).damaged_result() is None and TrialDir(folder).changed_files(weights=True) == {}


def _damage(folder: Path, other: Path, name: str, damage: str) -> None:
    path = folder / name
    if damage == "another trial's copy":
        shutil.copyfile(other / name, path)
    elif damage == "cut short":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "zero bytes":
        path.write_bytes(b"")
    else:
        path.unlink()


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", KINDS)
def test_each_reader_names_a_changed_file_and_does_what_it_does_for_a_damaged_record(pristine, tmp_path, name, damage):
    from smallinit.experiments.data.load import load
    from smallinit.sweeper.results.results import build_table, write_table

    a, b = pristine
    sweep = tmp_path / "sweep"
    shutil.copytree(a.parent.parent, sweep)
    write_table(sweep, build_table(sweep))  # the table the sweep wrote, before the damage
    folder, other = sweep / "trials" / a.name, sweep / "trials" / b.name
    same = (folder / name).read_bytes() == (other / name).read_bytes()
    _damage(folder, other, name, damage)
    # Another trial's same-sized weights are caught where they are read (export) only.
    unseen = damage == "another trial's copy" and (same or name == "model.pt")

    why = TrialDir(folder).damaged_result()
    report = load([sweep])  # reads the table written before: it holds each trial to its files
    table = build_table(sweep).set_index("trial_identity")  # the table the next run writes
    if unseen:
        assert why is None and report.left_out == [] and table.loc[a.name, "state"] == "COMPLETE"
    else:
        assert why is not None and why.startswith("the record of files that changed since: ") and name in why
        assert len(report.left_out) == 1 and report.left_out[0].startswith(f"trial {a.name} left out of every verdict: ")
        assert name in report.left_out[0] and a.name not in set(report.complete["trial_identity"])
        assert table.loc[a.name, "state"] == "FAIL" and name in table.loc[a.name, "fail_reason"]
    assert table.loc[b.name, "state"] == "COMPLETE" and b.name in set(report.complete["trial_identity"])

    if name in EXPORT_READS and damage != "deleted" and not (damage == "another trial's copy" and same):
        pytest.importorskip("transformers")
        from smallinit.trainer.export import export

        with pytest.raises(ConfigError, match=rf"{name} is (damaged|.*: the export would not be this trial's model)"):
            export(folder, tmp_path / "hf")
        assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("content", [b"", b'{"config": null}', b"[1, 2]"])
def test_the_reports_other_readers_take_a_damaged_record_without_a_traceback(pristine, tmp_path, content):
    """What `make report` reads beside the list (older trials have none): a trial.json or a
    fixed_overrides.json that is empty, holds no config, or is not a mapping."""
    from types import SimpleNamespace

    from smallinit.experiments.report.findings import _fixed_overrides
    from smallinit.experiments.stats.valnoise import _trial_windows

    folder = tmp_path / "trial"
    shutil.copytree(pristine[0], folder)
    assert _trial_windows(str(folder / "per_token_losses.npz")) is not None
    (folder / "trial.json").write_bytes(content)
    _trial_windows.cache_clear()  # one report reads each file once
    assert _trial_windows(str(folder / "per_token_losses.npz")) is None
    (tmp_path / "fixed_overrides.json").write_bytes(content)
    assert _fixed_overrides(SimpleNamespace(dirs=[tmp_path]), {}, skip=()) in (None, [])  # no command to repeat
