"""core/written.py: no command writes over a file it did not write, and the commands that write
records and reports follow it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from smallinit.core.errors import ConfigError
from smallinit.core.written import LIST, require_own, write_outputs

from .conftest import REPO


def test_our_own_files_are_written_again_and_no_one_elses(tmp_path):
    write_outputs(tmp_path, {"a.md": "one", "b.json": b"{}"}, by="tool")
    write_outputs(tmp_path, {"a.md": "two"}, by="other tool")  # ours, unchanged since: rebuilt
    assert (tmp_path / "a.md").read_text() == "two"

    (tmp_path / "mine.md").write_text("a user's notes")
    with pytest.raises(ConfigError, match=r"mine.md: not written by a smallinit command\); .*nothing was written"):
        write_outputs(tmp_path, {"a.md": "three", "mine.md": "x"}, by="tool")
    assert (tmp_path / "a.md").read_text() == "two" and (tmp_path / "mine.md").read_text() == "a user's notes"

    (tmp_path / "b.json").write_text('{"edited": true}')
    with pytest.raises(ConfigError, match="b.json: changed since tool wrote it"):
        write_outputs(tmp_path, {"b.json": "{}"}, by="tool")
    assert (tmp_path / "b.json").read_text() == '{"edited": true}'
    write_outputs(tmp_path, {"b.json": "{}", "mine.md": "taken over"}, by="tool", adopt=True)  # --overwrite
    write_outputs(tmp_path, {"mine.md": "ours now"}, by="tool")
    assert (tmp_path / "mine.md").read_text() == "ours now"


def test_a_folder_a_command_owns_whole_is_checked_before_the_first_write(tmp_path):
    write_outputs(tmp_path, {"report.md": "r", "fig.png": b"\x89PNG"}, by="report")
    require_own(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"sub/x.txt: not written"):
        require_own(tmp_path)
    require_own(tmp_path, adopt=True)
    require_own(tmp_path / "not yet")  # a new folder holds nothing to refuse
    (tmp_path / LIST).write_text("{cut")
    with pytest.raises(ConfigError, match=r"\.written\.json is unreadable"):
        require_own(tmp_path)


def test_a_record_tool_refuses_a_users_file_in_one_line(tmp_path):
    """records.wsd_check --out over a file no command of ours wrote: exit 2, one line, untouched.
    (The same helper, records.write_record, writes every records tool's --out.)"""
    from records import write_record

    target = tmp_path / "check.md"
    target.write_text("my table")
    with pytest.raises(SystemExit) as stop:
        write_record(target, "generated", "records.wsd_check")
    assert stop.value.code == 2 and target.read_text() == "my table"
    write_record(target, "generated", "records.wsd_check", overwrite=True)
    write_record(target, "generated again", "records.wsd_check")
    assert target.read_text() == "generated again"


def test_the_report_refuses_a_folder_holding_a_users_file(tiny_sweep, tmp_path):
    out = tmp_path / "reports" / tiny_sweep.name
    out.mkdir(parents=True)
    (out / "notes.md").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "smallinit.experiments.report.report", "--sweep", str(tiny_sweep),
                           "--out", str(tmp_path / "reports"), "--boot", "20"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "notes.md: not written by a smallinit command" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.md"]


def test_the_results_table_is_never_written_over_once_a_user_edited_it(tmp_path, capsys):
    """A results.csv annotated in a spreadsheet is set aside and named as the sweep next writes
    its table; a table the sweep wrote (or one from before the list) is simply replaced."""
    import pandas as pd

    from smallinit.sweeper.results.results import write_table

    legacy = tmp_path / "results.csv"
    legacy.write_text("identity\nold\n")  # a table from before .written.json: the sweep's own
    write_table(tmp_path, pd.DataFrame({"identity": ["a"], "final_val_loss": [4.5]}))
    assert capsys.readouterr().out == "" and pd.read_csv(legacy)["identity"].tolist() == ["a"]
    write_table(tmp_path, pd.DataFrame({"identity": ["a", "b"], "final_val_loss": [4.5, 4.25]}))
    assert capsys.readouterr().out == "" and sorted(p.name for p in tmp_path.iterdir()) == \
        [".written.json", "results.csv", "results.parquet"]
    legacy.write_text(legacy.read_text() + "# b looks odd: check its data\n")
    write_table(tmp_path, pd.DataFrame({"identity": ["a", "b", "c"], "final_val_loss": [4.5, 4.25, 4.0]}))
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("results.csv.edited-")]
    assert len(aside) == 1 and aside[0].read_text().endswith("# b looks odd: check its data\n")
    out = capsys.readouterr().out
    assert out == (f"{legacy} was changed since the sweep (results table) wrote it: kept as {aside[0].name}; "
                   "the sweep writes its table anew\n")
    assert pd.read_csv(legacy)["identity"].tolist() == ["a", "b", "c"]
    assert pd.read_parquet(tmp_path / "results.parquet")["identity"].tolist() == ["a", "b", "c"]


def test_a_write_cut_between_the_files_and_the_list_leaves_files_the_list_knows(tmp_path, monkeypatch):
    """A full disk or a kill after the first file: each file is as it was or as this command wrote
    it, and neither is then refused as "changed since" (the sweep would set its own table aside)."""
    from smallinit.core import written

    written.write_outputs(tmp_path, {"a.csv": "old a\n", "b.csv": "old b\n"}, by="test")
    real, calls = written.atomic_write, []

    def cut_after_one(path, write):
        calls.append(path.name)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        real(path, write)

    monkeypatch.setattr(written, "atomic_write", cut_after_one)
    with pytest.raises(OSError):
        written.write_outputs(tmp_path, {"a.csv": "new a\n", "b.csv": "new b\n"}, by="test")
    monkeypatch.undo()
    assert (tmp_path / "a.csv").read_text() == "new a\n" and (tmp_path / "b.csv").read_text() == "old b\n"
    assert written.blocked(tmp_path, ["a.csv", "b.csv"]) == {}
    (tmp_path / "b.csv").write_text("edited b\n")
    assert written.blocked(tmp_path, ["b.csv"]) == {"b.csv": "changed since test wrote it"}
