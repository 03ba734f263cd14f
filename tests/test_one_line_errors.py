"""One line where tracebacks were: a damaged metrics.jsonl under the report, and an export onto a
file or from a damaged model.pt. Each names the file and what to do; a metrics file whose last
line a kill cut short is still used up to that line.

The end-to-end cases damage a copy of the report's tiny sweep (tests/conftest.py), so no sweep
is trained here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from smallinit.experiments.data.load import ReportError, load
from smallinit.experiments.data.trial_files import read_metrics
from smallinit.trainer.export import main as export_main

from .conftest import WIDTHS, report_cli

LINES = [{"step": 0, "val/loss": 5.5}, {"step": 4, "train/loss": 5.25}, {"step": 8, "val/loss": 4.75, "tokens": 512}]


def write_lines(path: Path, tail: bytes = b"", rows=LINES) -> Path:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + tail)
    return path


def test_a_last_line_cut_by_a_kill_is_left_out_and_the_steps_before_it_are_used(tmp_path):
    whole = read_metrics(write_lines(tmp_path / "whole.jsonl"))
    for tail in (b'{"step": 12, "val/lo', b'{"st', b'{"step": 12, "val/loss": 4.5'):
        cut = read_metrics(write_lines(tmp_path / "cut.jsonl", tail))
        assert cut["step"].tolist() == [0, 4, 8]
        pd.testing.assert_frame_equal(cut, whole)
    assert cut["val/loss"].tolist()[::2] == [5.5, 4.75] and cut["tokens"].iloc[-1] == 512
    # A whole last line without its newline is a step like the others.
    assert read_metrics(write_lines(tmp_path / "nonl.jsonl", b'{"step": 12, "val/loss": 4.5}'))["step"].tolist() \
        == [0, 4, 8, 12]


@pytest.mark.parametrize("content, line, says", [
    (b"\x80\x04\x95\xff\x00garbage\n\x00\x01", 1, "line 1 is not UTF-8 text"),
    (b'{"step": 0, "val/loss": 5.5}\n{"step": 4, "val/lo\n{"step": 8, "val/loss": 4.75}\n', 2, "line 2 is not JSON"),
    (b'{"step": 0, "val/loss": 5.5}\n[1, 2]\n', 2, "line 2 is a list"),
    (b'{"step": 0}\n{"step": 4}\n"text"\n', 3, "line 3 is a str"),
    (b'{"step": 0}\n{"val/loss": 4.0}\n', 2, "line 2 is an object without an integer step"),
    (b'{"step": 0}\n{"step": "4"}\n', 2, "without an integer step"),
    (b'{"step": 0}\n\xff\xfe\x00 not text', 2, "line 2 is not UTF-8 text"),  # garbage as the last line
    (b'{"step": 0}\n{ cut by an editor, not by the trainer', 2, "line 2 is not JSON"),
])
def test_a_damaged_metrics_file_is_one_line_naming_the_file_and_the_line(tmp_path, content, line, says):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(content)
    with pytest.raises(ReportError) as e:
        read_metrics(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: line {line} ") and says in msg and "move it aside" in msg
    assert "\n" not in msg


@pytest.mark.slow
def _before_the_list(*folders: Path) -> None:
    """Each trial's result.json as written before it listed the trial's files (core/trial_files.py):
    the readers then meet each damaged file themselves. A sweep folder: every trial in it."""
    for folder in folders:
        for result in [folder / "result.json"] if (folder / "result.json").exists() else folder.glob("trials/*/result.json"):
            record = json.loads(result.read_text())
            record.pop("files", None)
            result.write_text(json.dumps(record))


def test_the_report_leaves_out_a_trial_whose_files_changed_and_says_so(tiny_sweep, tmp_path):
    sweep = tmp_path / "rep"
    shutil.copytree(tiny_sweep, sweep)
    done = load([sweep]).complete
    metrics = Path(done["metrics_path"].iloc[0])
    metrics.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xff")
    proc = report_cli("--sweep", str(sweep), "--out", str(tmp_path / "out"), "--widths", WIDTHS, "--boot", "20")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = (f"trial {metrics.parent.name} left out of every verdict: {metrics.parent / 'result.json'} is the record of "
            f"files that changed since: metrics.jsonl is cut short (")
    assert line in proc.stderr and "rerun the sweep's command to train it again" in proc.stderr
    assert "Left out of every comparison" in (tmp_path / "out" / "rep" / "report.md").read_text()


def test_the_report_names_a_damaged_metrics_file_and_uses_one_cut_by_a_kill(tiny_sweep, tmp_path):
    sweep = tmp_path / "rep"
    shutil.copytree(tiny_sweep, sweep)
    _before_the_list(sweep)
    paths = [Path(p) for p in load([sweep]).complete["metrics_path"]]
    cut, garbage = paths[0], paths[1]
    whole = read_metrics(cut)
    cut.write_bytes(cut.read_bytes() + b'{"step": 99999, "val/loss": 1.2')
    pd.testing.assert_frame_equal(read_metrics(cut), whole)  # the cut line is no step of the curve
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xff")

    proc = report_cli("--sweep", str(sweep), "--out", str(tmp_path / "out"), "--widths", WIDTHS, "--boot", "20")
    assert proc.returncode == 2, proc.stderr[-3000:]
    # The report's progress lines (on stderr too), then the error as its last and only line.
    assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {garbage}: line 1 is not UTF-8 text: the file is damaged; restore it, or move it aside to report "
        "without this trial's curves")
    assert not (tmp_path / "out" / "rep" / "index.html").exists()

    garbage.rename(garbage.with_name("metrics.jsonl.damaged"))  # what the line says to do
    proc = report_cli("--sweep", str(sweep), "--out", str(tmp_path / "out"), "--widths", WIDTHS, "--boot", "20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and (tmp_path / "out" / "rep" / "index.html").stat().st_size > 0


@pytest.mark.parametrize("which", ["per_token", "probe"])
def test_the_report_names_a_damaged_npz_in_one_line(tiny_sweep, tmp_path, which):
    sweep = tmp_path / "rep"
    shutil.copytree(tiny_sweep, sweep)
    _before_the_list(sweep)
    done = load([sweep]).complete
    if which == "per_token":
        damaged = Path(done["per_token_losses_path"].dropna().iloc[0])
    else:
        damaged = sorted(Path(done["probes_dir"].dropna().iloc[0]).glob("step_*.npz"))[-1]
    damaged.write_bytes(b"not a zip at all")
    proc = report_cli("--sweep", str(sweep), "--out", str(tmp_path / "out"), "--widths", WIDTHS, "--boot", "20")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {damaged} is damaged (not an .npz (zip) file): restore it, or move its trial folder aside and rerun "
        "the sweep's command to train that trial again")


@pytest.fixture
def trial(tiny_sweep, tmp_path) -> Path:
    """A copy of one finished trial folder of the tiny sweep (model.pt, trial.json, result.json)."""
    src = next(p.parent for p in sorted((tiny_sweep / "trials").glob("*/model.pt")))
    return Path(shutil.copytree(src, tmp_path / src.name))


def export_cli(capsys, *args) -> tuple[int, list[str]]:
    rc = export_main([str(a) for a in args])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_export_onto_a_file_is_one_line_naming_it(trial, tmp_path, capsys):
    target = tmp_path / "model.safetensors"
    target.write_text("keep me")
    rc, err = export_cli(capsys, trial, target)
    assert rc == 2 and err == [f"error: OUT_DIR={target} is invalid: {target} is a file, not a folder; give a new "
                               "or existing folder for the Hugging Face files"]
    rc, err = export_cli(capsys, trial, target / "hf")  # a folder below a file
    assert rc == 2 and err == [f"error: OUT_DIR={target / 'hf'} is invalid: {target} is a file, not a folder; "
                               "give a new or existing folder for the Hugging Face files"]
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "before the list"])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "not a checkpoint"])
def test_export_from_a_damaged_model_pt_is_one_line_naming_it(trial, tmp_path, capsys, damage, listed):
    import torch

    if not listed:
        _before_the_list(trial)
    weights = trial / "model.pt"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00\xff" * 100)
    else:
        torch.save([1, 2, 3], weights)
    rc, err = export_cli(capsys, trial, tmp_path / "hf")
    assert rc == 2 and len(err) == 1, err
    if listed:  # held to what result.json lists (core/trial_files.py)
        assert err[0].startswith(f"error: {trial}: model.pt is ") and "the export would not be this trial's model" in err[0]
    else:  # the weights' own reader
        assert err[0].startswith(f"error: {weights} is unreadable (")
        assert err[0].endswith("copy it again from where it came, or move the trial's result.json aside and rerun the "
                               "sweep's command to train the trial again")
    assert not (tmp_path / "hf").exists()  # refused before anything is written


def test_a_damaged_sweep_record_is_named_and_the_report_reads_the_trials_without_it(tiny_sweep, tmp_path):
    sweep = tmp_path / "rep"
    shutil.copytree(tiny_sweep, sweep)
    (sweep / "fixed_overrides.json").write_bytes(b"")
    (sweep / "protocol.json").write_text("[1]")
    loaded = load([sweep])
    assert loaded.damaged_records == [
        f"{sweep / 'fixed_overrides.json'} is unreadable (empty): this report leaves out the command that repeats the "
        "sweep; the sweep's command names the file and what to do",
        f"{sweep / 'protocol.json'} is unreadable (not a JSON object): this report leaves out the select-then-confirm "
        "choices' command; the sweep's command names the file and what to do"]
    assert len(loaded.complete) == len(load([tiny_sweep]).complete)  # every trial still read
    from smallinit.experiments.report.findings import _protocol_record
    assert _protocol_record(loaded) == {}  # the report's command lines read it as no record


def test_every_reader_of_a_sweeps_table_and_protocol_goes_through_one_reader():
    """results.parquet and protocol.json are read in one place (experiments/data/sweep_records.py):
    no other library or record module opens them, so a damaged one is named the same way everywhere."""
    from .conftest import REPO

    readers = []
    for path in [*(REPO / "src" / "smallinit").rglob("*.py"), *(REPO / "records").rglob("*.py")]:
        for line in path.read_text().splitlines():
            if "read_parquet(" in line or ("protocol.json" in line and ("read_text(" in line or "json.load" in line)):
                readers.append(str(path.relative_to(REPO)))
                break
    assert readers == ["src/smallinit/experiments/data/sweep_records.py"]


@pytest.mark.parametrize("damaged", ["results.parquet", "protocol.json"])
def test_a_damaged_table_or_protocol_stops_each_record_tool_in_one_line(tiny_sweep, tmp_path, damaged):
    import subprocess
    import sys

    from .conftest import REPO

    sweep = tmp_path / "rep"
    shutil.copytree(tiny_sweep, sweep)
    (sweep / damaged).write_bytes(b"\x00 not a record")
    commands = [["records.wsd_check", "--wsd", str(sweep), "--cosine", str(sweep)],
                ["records.crossover_size", "--crossover", str(sweep)],
                ["smallinit.experiments.fits.token_crossover", "--sweep", str(sweep)]]
    if damaged == "results.parquet":  # the crossover's status reads the trial folders, mid-sweep too, not the table
        commands = commands[:2]
    for command in commands:
        proc = subprocess.run([sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, timeout=300)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(err) == 1 and "Traceback" not in proc.stderr, (command, proc.stderr[-2000:])
        assert err[0].startswith(f"error: {sweep / damaged} ") and ("cannot be read" in err[0] or "is unreadable" in err[0])


def test_a_trial_whose_result_was_moved_aside_after_the_table_is_left_out_and_named(tiny_sweep, tmp_path):
    """The tool's own advice for a damaged result is to move it aside and rerun; a report built
    in between must not count the row the table still calls COMPLETE."""
    sweep = tmp_path / "rep"
    shutil.copytree(tiny_sweep, sweep)
    before = load([sweep]).complete
    folder = Path(before["trial_dir"].iloc[0])
    (folder / "result.json").rename(folder / "result.json.aside")
    after = load([sweep])
    assert len(after.complete) == len(before) - 1 and str(folder) not in set(after.complete["trial_dir"])
    line = (f"trial {folder.name} left out of every verdict: {folder / 'result.json'} is missing (moved or deleted "
            "since the table was written); rerun the sweep's command to train it again")
    assert line in after.left_out


def test_a_budget_row_of_a_trial_still_training_stands_on_its_branch_file(tmp_path):
    from smallinit.core.trial_dir import TrialDir
    from smallinit.experiments.data.load import _why_left_out

    folder = TrialDir(tmp_path / "t")
    folder.path.mkdir()
    assert _why_left_out(folder, 1024) == f"{folder.budget_json(1024)} is missing (moved or deleted since the table was written)"
    folder.budget_json(1024).parent.mkdir()
    folder.budget_json(1024).write_text('{"final_val_loss": ')
    assert _why_left_out(folder, 1024).startswith(f"{folder.budget_json(1024)} is damaged (not readable JSON")
    from smallinit.core.trial_dir import RESULT_KEYS

    folder.write_budget_result(1024, dict.fromkeys(RESULT_KEYS, 0.0) | {
        "identity": "abc", "steps": 1, "tokens": 1024, "n_params": 1, "final_val_loss": 5.0, "budget_tokens": 1024})
    assert _why_left_out(folder, 1024) is None  # a whole branch of a trial still training is reported


def test_the_record_builders_hold_each_row_to_its_folder_as_the_report_does(tiny_sweep, tmp_path, capsys):
    from records import sweep_table

    sweep = tmp_path / "rep"
    shutil.copytree(tiny_sweep, sweep)
    rows = sweep_table(sweep)
    folder = Path(rows.loc[rows["state"] == "COMPLETE", "trial_dir"].iloc[0])
    (folder / "metrics.jsonl").write_bytes(b'{"step": 0}\n')
    capsys.readouterr()
    again = sweep_table(sweep)
    assert set(again.loc[again["trial_dir"] == str(folder), "state"]) == {"FAIL"}
    assert (again["state"] == "COMPLETE").sum() == (rows["state"] == "COMPLETE").sum() - 1
    err = capsys.readouterr().err
    assert f"{sweep}: trial {folder.name} left out of every verdict: {folder / 'result.json'} is the record of files " \
           "that changed since: metrics.jsonl" in err


def test_an_export_edited_since_is_not_written_over_without_overwrite(tmp_path):
    """The export's mark holds each file's sha256: a re-export of the same trial replaces only the
    files as it wrote them; a user's edit of one of them is refused, named, unless --overwrite."""
    from smallinit.core.errors import ConfigError
    from smallinit.core.trial_files import sha256
    from smallinit.trainer.export import MARK, _earlier_export

    out = tmp_path / "hf"
    out.mkdir()
    for name in ("config.json", "generation_config.json"):
        (out / name).write_text('{"a": 1}\n')
    (out / MARK).write_text(json.dumps({"identity": "abc", "files": {n: sha256(out / n) for n in
                                                                      ("config.json", "generation_config.json")}}))
    assert _earlier_export(out, "abc", overwrite=False) == ["config.json", "generation_config.json"]
    (out / "generation_config.json").write_text('{"a": 1, "temperature": 0.7}\n')
    with pytest.raises(ConfigError, match=r"files of its export were edited since \(generation_config.json\); give "
                                          r"another folder, or --overwrite to replace them \(nothing was written\)"):
        _earlier_export(out, "abc", overwrite=False)
    assert _earlier_export(out, "abc", overwrite=True) == ["config.json", "generation_config.json"]
    # A mark from before the hashes lists names: nothing to hold them to, as before.
    (out / MARK).write_text(json.dumps({"identity": "abc", "files": ["config.json", "generation_config.json"]}))
    assert _earlier_export(out, "abc", overwrite=False) == ["config.json", "generation_config.json"]


def test_a_report_into_a_file_is_one_line(tiny_sweep, tmp_path):
    a_file = tmp_path / "reports"
    a_file.write_text("mine")
    proc = report_cli("--sweep", str(tiny_sweep), "--out", str(a_file), "--widths", WIDTHS, "--boot", "20")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(f"--out={a_file} is invalid: {a_file} is a file; give a folder "
                                                         "(nothing was written)")
    assert a_file.read_text() == "mine"


def test_a_screenshot_of_a_page_that_is_not_a_report_is_one_line(tmp_path, capsys):
    from smallinit.experiments.report.screenshot import find_browser, main

    if find_browser() is None:
        pytest.skip("no chromium here")
    page = tmp_path / "report.md"
    page.write_text("# not a report's index.html\n")
    assert main([str(page)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {page}: the page's load script did not run") and "is it a report's index.html?" in err
    assert err.count("\n") == 1
