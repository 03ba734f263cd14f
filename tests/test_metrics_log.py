"""metrics.jsonl read one way by every reader (core/metrics_log.py): a last line a kill or a full
disk cut short is left out, any other bad line is an error naming the file and the line. The
trainer resuming a trial is the reader where this matters most: a cut line there used to be a
bare JSONDecodeError, which the sweep records as the trial's own (permanent) failure, so a trial
a full disk stopped was never retried."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smallinit.core.trial_dir import DamagedFile, TrialDir
from smallinit.sweeper.worker.failures import classify
from smallinit.trainer.reporting import JsonlReporter

from .conftest import REPO

ROWS = [{"step": 64, "train/loss": 5.25}, {"step": 128, "train/loss": 5.0, "val/loss": 5.125},
        {"step": 192, "train/loss": 4.75}, {"step": 256, "train/loss": 4.5, "val/loss": 4.625}]
CUT = b'{"step": 320, "train/lo'


def write(path: Path, tail: bytes = b"") -> Path:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in ROWS) + tail)
    return path


def test_a_trial_resumed_after_a_cut_last_line_keeps_its_steps_to_the_checkpoint_byte_for_byte(tmp_path):
    path = write(tmp_path / "metrics.jsonl", CUT)
    whole = path.read_bytes()[:-len(CUT)]
    JsonlReporter(path, resume_step=192).close()
    assert path.read_bytes() == b"".join(json.dumps(r).encode() + b"\n" for r in ROWS[:3])
    JsonlReporter(write(path, CUT), resume_step=256).close()
    assert path.read_bytes() == whole


def test_a_damaged_line_stops_a_resume_naming_the_file_and_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 64}\n{"step": 12\x00garbage\n{"step": 192}\n')
    with pytest.raises(DamagedFile) as e:
        JsonlReporter(path, resume_step=192)
    assert str(e.value).startswith(f"{path} is damaged (line 2 is not JSON")
    assert path.read_bytes().startswith(b'{"step": 64}\n{"step": 12\x00')  # left as it was, for a look
    assert str(path) in classify(e.value)[1]  # the failed trial's reason in the results table names it


def test_the_results_table_reads_the_last_losses_through_a_cut_line_and_names_a_damaged_one(tmp_path):
    folder = TrialDir(tmp_path / "t")
    folder.path.mkdir()
    write(folder.metrics, CUT)
    assert folder.last_metrics() == {"step": 256, "train/loss": 4.5, "val/loss": 4.625}
    folder.metrics.write_bytes(b'{"step": 64}\n[1, 2]\n{"step": 128}\n')
    with pytest.raises(DamagedFile, match="line 2 is a list, not a logged step"):
        folder.last_metrics()
    folder.metrics.unlink()
    assert folder.last_metrics() == {} and folder.metrics_rows() == []


def test_no_module_reads_metrics_jsonl_but_the_one_reader():
    """A new reader of the file that parses it itself would treat a cut line its own way."""
    readers = []
    for path in [*(REPO / "src" / "smallinit").rglob("*.py"), *(REPO / "records").rglob("*.py")]:
        for line in path.read_text().splitlines():
            if ".metrics.read_" in line or ".metrics.open(" in line or ('metrics.jsonl")' in line and ".read_" in line):
                readers.append(str(path.relative_to(REPO)))
    assert readers == []
