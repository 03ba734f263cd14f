"""experiments/wsd_check.py: each cosine run paired with the branch of the same trial at its budget."""

from __future__ import annotations

import pandas as pd

from experiments.wsd_check import main, pair, table

SAME = dict(d_model=64, n_layers=4, gamma=1.0, eps=1e-12, gate="elementwise", norm="rmsnorm", lr=1e-3, state="COMPLETE")


def _rows():
    wsd = pd.DataFrame([dict(SAME, init_seed=s, train_seed=s, budget_tokens=b, tokens=b, final_val_loss=6.0 - b / 1e6 + s / 100)
                        for s in (1, 2, 3) for b in (1000, 2000)]
                       + [dict(SAME, lr=3e-3, init_seed=1, train_seed=1, budget_tokens=1000, tokens=1000,
                               final_val_loss=9.0)])  # another lr: no cosine run of its own
    cosine = pd.DataFrame([dict(SAME, init_seed=s, train_seed=s, budget_tokens=None, tokens=b,
                                final_val_loss=6.0 - b / 1e6 + s / 100 + 0.01 * s) for s in (1, 2, 3) for b in (1000, 2000)])
    return wsd, cosine


def test_pairs_by_trial_and_budget_and_gives_the_paired_difference():
    pairs = pair(*_rows())
    assert len(pairs) == 6 and set(pairs["budget"]) == {1000, 2000}
    assert pairs["diff"].round(6).tolist() == [-0.01, -0.02, -0.03] * 2  # wsd - cosine, seed by seed
    text = table(pairs)
    assert "| 1,000 | 1, 2, 3 |" in text and "-0.0200" in text


def test_cli_writes_the_table_and_refuses_sweeps_with_nothing_to_pair(tmp_path, capsys):
    wsd, cosine = _rows()
    for name, df in (("wsd", wsd), ("cos", cosine), ("other", cosine.assign(lr=0.1))):
        (tmp_path / name).mkdir()
        df.to_parquet(tmp_path / name / "results.parquet")
    assert main(["--wsd", str(tmp_path / "wsd"), "--cosine", str(tmp_path / "cos"), "--out", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text().startswith("| budget [tokens] |")
    assert main(["--wsd", str(tmp_path / "wsd"), "--cosine", str(tmp_path / "other")]) == 1
    assert "matches a branch" in capsys.readouterr().err
