"""Several sweeps at once: `make report SWEEP=a,b` keeps each sweep's rows, labelled, and refuses
a trial trained in two of them; `python -m smallinit.experiments.data.compare A B` says how two folders differ."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from smallinit.experiments.data import compare
from smallinit.experiments.data.load import ReportError, load

from .conftest import REPO, result_row, write_results


def _rows(prefix: str, gammas=(0.5, 1.0), seeds=(0, 1), **kw) -> list[dict]:
    return [result_row(identity=f"{prefix}{g}-{s}", trial_identity=f"{prefix}{g}-{s}", gamma=g, init_seed=s,
                       train_seed=s, lr=3e-3, final_val_loss=4.0 - g / 10 + s / 100, **kw)
            for g in gammas for s in seeds]


def test_two_sweeps_keep_every_row_labelled_by_their_sweep(tmp_path):
    a = write_results(tmp_path, "a", _rows("a"))
    b = write_results(tmp_path, "b", _rows("b", gammas=(1.5,)))
    sweep = load([a, b])
    assert len(sweep.results) == 6
    assert sweep.results.groupby("sweep").size().to_dict() == {"a": 4, "b": 2}
    assert sorted(sweep.complete["sweep"].unique()) == ["a", "b"]


def test_a_trial_in_two_sweeps_is_refused_naming_it_and_both_folders(tmp_path):
    a = write_results(tmp_path, "a", _rows("x"))
    b = write_results(tmp_path, "b", _rows("x", gammas=(1.0, 1.5)))  # x1.0-0 and x1.0-1 trained in both
    with pytest.raises(ReportError) as e:
        load([a, b])
    msg = str(e.value)
    assert "\n" not in msg
    assert "trial x1.0-0 (and 1 more) is in both" in msg and str(a) in msg and str(b) in msg
    assert "counted twice" in msg and f"SWEEP={a}" in msg


def test_budget_rows_of_one_trial_in_one_sweep_are_not_a_duplicate(tmp_path):
    rows = [result_row(identity=f"t@{n}", trial_identity="t", budget_tokens=n, gamma=0.5, init_seed=0, train_seed=0,
                       lr=3e-3, final_val_loss=4.0 - n / 1e4) for n in (1000, 2000)]
    a = write_results(tmp_path, "a", rows)
    b = write_results(tmp_path, "b", _rows("b"))
    assert len(load([a, b]).results) == 6
    c = write_results(tmp_path, "c", [{**r, "identity": r["identity"].replace("t@", "t@9")} for r in rows])
    with pytest.raises(ReportError, match=r"trial t is in both"):  # another budget of the same trial
        load([a, c])


def test_one_trial_folder_two_tables_list_is_one_trial(tmp_path):
    """A study shared between folders: b's table lists the trial a's folder trained."""
    a = write_results(tmp_path, "a", [{**r, "trial_dir": f"trials/{r['identity']}"} for r in _rows("s")])
    shared = [{**r, "trial_dir": str(a / "trials" / r["identity"])} for r in _rows("s", gammas=(1.0,))]
    b = write_results(tmp_path, "b", shared + _rows("b", gammas=(1.5,)))
    sweep = load([a, b])
    assert len(sweep.results) == 6
    assert sweep.results.groupby("sweep").size().to_dict() == {"a": 4, "b": 2}


def _folder(root, name, rows, fixed: dict[str, str] | None, swept: list[str]):
    d = write_results(root, name, rows)
    if fixed is not None:
        (d / "fixed_overrides.json").write_text(json.dumps({"fixed": fixed, "swept": swept}))
    return d


def test_compare_names_the_differing_overrides_swept_keys_and_shared_trials(tmp_path, capsys):
    a = _folder(tmp_path, "a", _rows("x"), {"model": "model=nano", "train.max_tokens": "train.max_tokens=4096",
                                            "norm.eps": "norm.eps=1e-5"}, ["init.gamma", "seed"])
    rows_b = [{**r, "identity": f"{r['identity']}@2048"} for r in _rows("x", gammas=(1.0, 1.5))]
    rows_b = [{k: v for k, v in r.items() if k != "trial_identity"} for r in rows_b]  # an older table: identity only
    b = _folder(tmp_path, "b", rows_b, {"model": "model=micro", "norm.eps": "norm.eps=1e-5"}, ["init.gamma", "optim.lr"])
    assert compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"A: {a}", f"B: {b}"]
    assert out[2] == "fixed overrides that differ (2; 1 the same):"
    assert out[3:5] == ["  model: A model=nano, B model=micro",
                        "  train.max_tokens: A train.max_tokens=4096, B (not set)"]
    assert out[5] == "swept keys: A init.gamma, seed; B init.gamma, optim.lr"
    assert out[6] == "  in both: init.gamma; only A: seed; only B: optim.lr"
    assert out[7] == "trial identities: 2 in both, 2 only in A, 2 only in B"


def test_compare_of_the_same_overrides_and_a_folder_without_a_record(tmp_path, capsys):
    a = _folder(tmp_path, "a", _rows("a"), {"model": "model=nano"}, ["init.gamma"])
    b = _folder(tmp_path, "b", _rows("b"), {"model": "model=nano"}, ["init.gamma"])
    c = _folder(tmp_path, "c", _rows("c"), None, [])
    assert compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "fixed overrides: the same (1: model=nano)" in out and "0 in both, 4 only in A, 4 only in B" in out
    assert compare.main([str(a), str(c)]) == 0
    assert f"fixed overrides: unknown ({c} has no fixed_overrides.json" in capsys.readouterr().out


def test_compare_refuses_a_folder_without_results_in_one_line(tmp_path):
    a = _folder(tmp_path, "a", _rows("a"), {}, [])
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "smallinit.experiments.data.compare", str(a), str(empty)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"error: {empty}/results.parquet is missing: not a finished sweep folder " \
                                  "(rerun its command to rebuild it)"
    with pytest.raises(ReportError, match="does not exist"):
        compare.read_folder(tmp_path / "nowhere")
