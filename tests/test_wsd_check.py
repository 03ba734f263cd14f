"""records/wsd_check.py: each cosine run paired with the branch of the same trial at its
budget, each side at the lr its own sweep chose (its confirm trials)."""

from __future__ import annotations

import pandas as pd

from records.wsd_check import arm_difference, main, pair, table

SAME = dict(d_model=64, n_layers=4, gamma=1.0, eps=1e-12, gate="elementwise", norm="rmsnorm", state="COMPLETE")


def _rows():
    def trial(lr, seed, budget, loss, role, budget_tokens):
        return dict(SAME, lr=lr, init_seed=seed, train_seed=seed, budget_tokens=budget_tokens, tokens=budget,
                    final_val_loss=loss, role=role)

    wsd = pd.DataFrame([trial(1e-3, s, b, 6.0 - b / 1e6 + s / 100, "confirm", b) for s in (1, 2, 3) for b in (1000, 2000)]
                       + [trial(lr, 100, b, 9.0, "tune", b) for lr in (1e-3, 3e-3) for b in (1000, 2000)])
    cosine = pd.DataFrame([trial(3e-3, s, b, 6.0 - b / 1e6 + s / 100 + 0.01 * s, "confirm", None)
                           for s in (1, 2, 3) for b in (1000, 2000)]
                          + [trial(lr, 100, b, 9.0, "tune", None) for lr in (1e-3, 3e-3) for b in (1000, 2000)])
    return wsd, cosine


def test_pairs_confirm_trials_by_seed_and_budget_whatever_lr_each_side_chose():
    wsd, cosine = _rows()
    pairs = pair(wsd[wsd["role"] == "confirm"], cosine[cosine["role"] == "confirm"])
    assert len(pairs) == 6 and set(pairs["budget"]) == {1000, 2000}
    assert pairs["diff"].round(6).tolist() == [-0.01, -0.02, -0.03] * 2  # wsd - cosine, seed by seed
    text = table(pairs)
    assert "| 1,000 | 1, 2, 3 | 0.001 | 0.003 |" in text and "-0.0200" in text


def test_cli_keeps_the_confirm_trials_writes_the_table_and_refuses_sweeps_with_nothing_to_pair(tmp_path, capsys):
    wsd, cosine = _rows()
    for name, df in (("wsd", wsd), ("cos", cosine), ("other", cosine.assign(gamma=0.5))):
        (tmp_path / name).mkdir()
        df.to_parquet(tmp_path / name / "results.parquet")
    assert main(["--wsd", str(tmp_path / "wsd"), "--cosine", str(tmp_path / "cos"), "--out", str(tmp_path / "t.md")]) == 0
    text = (tmp_path / "t.md").read_text()
    assert text.startswith("A WSD cooldown branch against a dedicated cosine run") and text.count("| 1, 2, 3 |") == 2
    assert main(["--wsd", str(tmp_path / "wsd"), "--cosine", str(tmp_path / "other")]) == 1
    assert "matches a branch" in capsys.readouterr().err


def test_a_per_budget_sweep_pairs_each_budget_with_the_branch_at_that_budgets_lr(tmp_path):
    import json

    from records.wsd_check import _complete

    wsd, cosine = _rows()
    # Confirm runs at two lrs, each chosen by one budget; the other lr's branch at that budget is a decoy.
    both = pd.concat([wsd[wsd["role"] == "confirm"].assign(lr=lr, final_val_loss=wsd["final_val_loss"] + off)
                      for lr, off in ((1e-3, 0.0), (3e-3, 5.0))]).assign(**{"config/arm": "small"})
    both.loc[(both["lr"] == 3e-3) & (both["budget_tokens"] == 2000), "final_val_loss"] -= 5.0
    (tmp_path / "wsd").mkdir()
    both.to_parquet(tmp_path / "wsd" / "results.parquet")
    record = {"per_budget": True, "choices": [{"setting": {"arm": "small"}, "chosen_by_budget": [
        {"budget_tokens": 1000, "chosen": {"optim.lr": 1e-3}}, {"budget_tokens": 2000, "chosen": {"optim.lr": 3e-3}}]}]}
    (tmp_path / "wsd" / "protocol.json").write_text(json.dumps(record))
    kept = _complete(tmp_path / "wsd")
    assert sorted(zip(kept["budget_tokens"], kept["lr"])) == [(1000, 1e-3)] * 3 + [(2000, 3e-3)] * 3
    pairs = pair(kept, cosine[cosine["role"] == "confirm"])
    assert len(pairs) == 6 and pairs["diff"].round(6).tolist() == [-0.01, -0.02, -0.03] * 2


def test_the_arms_branch_costs_are_compared_seed_by_seed():
    """Two arms whose branches cost them differently (recipe 0.05 more on every seed at one
    budget, the same at the other): the difference table says so, with its interval."""
    wsd, cosine = _rows()
    wsd, cosine = wsd[wsd["role"] == "confirm"], cosine[cosine["role"] == "confirm"]
    extra = wsd.assign(gamma=0.5, eps=1e-5, gate="none", **{"config/arm": "baseline"})
    cos_extra = cosine.assign(gamma=0.5, eps=1e-5, gate="none", **{"config/arm": "baseline"})
    recipe_wsd = wsd.assign(**{"config/arm": "small"})
    recipe_wsd.loc[recipe_wsd["budget_tokens"] == 1000, "final_val_loss"] += 0.05
    pairs = pair(pd.concat([extra, recipe_wsd]), pd.concat([cos_extra, cosine.assign(**{"config/arm": "small"})]))
    assert len(pairs) == 12 and set(pairs["config/arm"]) == {"baseline", "small"}
    text = arm_difference(pairs, "baseline")
    rows = [r for r in text.splitlines() if r.startswith("| 1,000") or r.startswith("| 2,000")]
    assert rows[0].split(" | ")[4] == "+0.0500" and rows[1].split(" | ")[4] == "+0.0000"
    assert "(small)" in table(pairs) and "(baseline)" in table(pairs)
    assert arm_difference(pairs[pairs["config/arm"] == "small"], "baseline") is None
