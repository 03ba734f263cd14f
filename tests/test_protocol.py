"""The comparison protocol on synthetic result tables with known answers: each arm at its own
best lr (with edge flags), rankings that must hold over the last quarter of training, nulls
worded as inconclusive with the effect they exclude, and the width trend's fit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smallinit.experiments.claims import claims as claims_mod
from smallinit.experiments.claims.width import width_trend
from smallinit.experiments.data.load import load
from smallinit.experiments.report.context import best_gamma_table
from smallinit.experiments.report.report import build
from smallinit.experiments.stats.curves import settled
from smallinit.experiments.stats.stats import A_LOWER, compare, verdict

from .conftest import result_row, width_sweep, write_results

LRS = (1e-3, 3e-3, 1e-2)


def lr_sweep(root: Path, seeds: int = 4) -> Path:
    """gamma 0.5 is best at lr 3e-3 (5.00); gamma 1 is best at lr 1e-2 (4.90, the grid's
    edge) but worse than gamma 0.5 at the shared lr 3e-3 (5.20)."""
    rng = np.random.default_rng(3)
    means = {(0.5, 1e-3): 5.10, (0.5, 3e-3): 5.00, (0.5, 1e-2): 5.15,
             (1.0, 1e-3): 5.40, (1.0, 3e-3): 5.20, (1.0, 1e-2): 4.90}
    rows = []
    for s in range(seeds):
        luck = rng.normal(0, 0.01)
        for (gamma, lr), m in means.items():
            rows.append(result_row(identity=f"{gamma}-{lr}-{s}", gamma=gamma, lr=lr, init_seed=s, train_seed=s,
                             final_val_loss=m + luck + rng.normal(0, 1e-3)))
    return write_results(root, "lrs", rows)


def test_each_setting_is_compared_at_its_own_best_lr(tmp_path):
    sweep = load([lr_sweep(tmp_path)])
    t = sweep.tuning
    assert t.axes == ["lr"]
    chosen = t.chosen.set_index("gamma")
    assert chosen.loc[0.5, "lr"] == 3e-3 and not chosen.loc[0.5, "at_edge"]
    assert chosen.loc[1.0, "lr"] == 1e-2 and chosen.loc[1.0, "at_edge"]  # the largest lr tried: flagged
    assert "widen it" in t.describe()
    # At the shared lr 3e-3 gamma 0.5 wins; at each one's own best lr gamma 1 wins: the report picks the latter.
    fixed = t.all_trials[np.isclose(t.all_trials["lr"], 3e-3)].groupby("gamma")["final_val_loss"].mean()
    assert fixed.idxmin() == 0.5
    best = best_gamma_table(sweep.complete, "final_val_loss")
    assert best["best_gamma"].tolist() == [1.0]
    c = claims_mod.best_gamma_claim(sweep, best, "final_val_loss")
    n = c.numbers[0]
    assert n["optim_a"] == {"lr": [1e-2], "weight_decay": [0.1]} and n["optim_b"]["lr"] == [3e-3]
    assert n["diff"] == pytest.approx(-0.10, abs=5e-3) and n["verdict"] == "supported"


def test_a_difference_whose_side_behind_sits_at_the_lr_edge_is_not_yet_real(tmp_path):
    """gamma 0.5 is behind gamma 1 beyond the spread, but chose the smallest lr tried: a
    smaller one could close the gap, so the difference waits for a wider grid. The side ahead
    at an edge (test above) decides: a wider grid could only widen its lead."""
    rng = np.random.default_rng(5)
    means = {(0.5, 1e-3): 5.10, (0.5, 3e-3): 5.15, (0.5, 1e-2): 5.30,
             (1.0, 1e-3): 5.05, (1.0, 3e-3): 4.95, (1.0, 1e-2): 5.00}
    rows = [result_row(identity=f"{g}-{lr}-{s}", gamma=g, lr=lr, init_seed=s, train_seed=s,
                 final_val_loss=m + 0.01 * s + rng.normal(0, 1e-3))
            for s in range(4) for (g, lr), m in means.items()]
    sweep = load([write_results(tmp_path, "edge", rows)])
    df = sweep.complete
    small, large = df[df["gamma"] == 1.0], df[df["gamma"] == 0.5]
    c = compare(small, large, "final_val_loss", curve="val/loss")
    assert c.status == A_LOWER and c.diff == pytest.approx(-0.15, abs=5e-3)
    assert c.edge_behind == "the side behind (B) is at the edge of its grid: lr = 0.001 is the smallest tried"
    v, why = verdict([c], A_LOWER)
    assert v == "inconclusive" and "edge of its lr grid" in why
    assert verdict([compare(large, small, "final_val_loss", curve="val/loss")], A_LOWER)[0] == "inconclusive"
    # Not a loss comparison (no curve): the lr grid is not what it is about.
    assert compare(small, large, "final_val_loss").edge_behind == ""
    # One smaller lr, worse: gamma 0.5's choice is now inside its grid and the difference is real.
    wider = rows + [result_row(identity=f"0.5-3e-4-{s}", gamma=0.5, lr=3e-4, init_seed=s, train_seed=s,
                         final_val_loss=5.25 + 0.01 * s) for s in range(4)]
    df = load([write_results(tmp_path, "wider", wider)]).complete
    c = compare(df[df["gamma"] == 1.0], df[df["gamma"] == 0.5], "final_val_loss", curve="val/loss")
    assert c.edge_behind == "" and verdict([c], A_LOWER)[0] == "supported"


def test_trials_that_ran_in_different_dtypes_are_never_paired(tmp_path):
    """A cluster that mixes CPUs with and without native bf16 runs some trials of one grid in
    bf16 (train.dtype=auto): dtype becomes part of the setting, so no comparison mixes them."""
    rows = [result_row(identity=f"{g}-{s}", gamma=g, lr=3e-3, init_seed=s, train_seed=s, dtype="bf16" if s >= 2 else "fp32",
                 final_val_loss=5.0 + 0.1 * g + 0.01 * s)
            for g in (0.5, 1.0) for s in range(4)]
    sweep = load([write_results(tmp_path, "mixed", rows)])
    assert "dtype" in sweep.setting_cols
    curves = sweep.complete.groupby("gamma_curve")["dtype"].agg(set)
    assert len(curves) == 2 and all(len(v) == 1 for v in curves)
    # One dtype throughout: not a setting, labels unchanged.
    same = load([write_results(tmp_path, "same", [{**r, "dtype": "fp32"} for r in rows])])
    assert "dtype" not in same.setting_cols


def test_report_names_the_chosen_lr_and_flags_the_edge(tmp_path):
    out = build([lr_sweep(tmp_path)], tmp_path / "reports", widths=(64, 128), n_boot=20, log=lambda _: None)
    s = json.loads((out / "summary.json").read_text())
    chosen = {c["gamma"]: c for c in s["tuning"]["chosen"]}
    assert chosen[1.0]["lr"] == 1e-2 and chosen[1.0]["at_edge"] and not chosen[0.5]["at_edge"]
    assert {"loss_vs_gamma_by_lr.png", "loss_vs_lr.png"} <= {f["file"] for f in s["figures"]}
    md = (out / "report.md").read_text()
    assert "best at the edge of the grid: widen it" in md
    best = next(c for c in s["claims"] if c["claim"].startswith("Best γ"))
    assert all("optim_a" in n and "verdict" in n for n in best["numbers"])


def test_without_an_lr_axis_the_report_names_the_one_lr(tmp_path):
    rows = [result_row(identity=f"{g}-{s}", gamma=g, lr=3e-3, init_seed=s, train_seed=s, final_val_loss=5 + g / 10 + s / 100)
            for g in (0.5, 1.0) for s in range(3)]
    sweep = load([write_results(tmp_path, "one", rows)])
    assert sweep.tuning.axes == [] and "one optimiser setting (lr = 0.003" in sweep.tuning.describe()


def test_an_lr_that_differs_between_arms_is_not_called_no_lr_axis(tmp_path):
    """A search that sampled each γ with its own lr: two lrs, none chosen between. The text
    must neither say there is no lr axis nor that each arm is at its own best lr."""
    rows = [result_row(identity=f"{g}-{s}", gamma=g, lr=lr, init_seed=s, train_seed=s, final_val_loss=5 + g / 10)
            for g, lr in ((0.5, 1e-3), (1.0, 3e-3)) for s in range(2)]
    out = build([write_results(tmp_path, "lrsearch", rows)], tmp_path / "reports", widths=(64, 128), n_boot=20,
                log=lambda _: None)
    md = (out / "report.md").read_text()
    assert "No learning-rate axis" not in md and "own best learning rate" not in md
    assert "ran at one optimiser setting, not all at the same one (lr = 0.001, 0.003;" in md
    assert "## How the arms are compared\n" in md


def _curve_sweep(root: Path, flip_at: int | None, pairs: int = 5, total: int = 100) -> Path:
    """A (gamma 1) is 0.05 below B at the end of training, with every seed agreeing; before
    `flip_at` A was above B. Each trial writes a real metrics.jsonl."""
    rows = []
    for s in range(pairs):
        for gamma in (0.5, 1.0):
            ident = f"{gamma}-{s}"
            path = root / "trials" / ident / "metrics.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = []
            for step in range(0, total + 1, 10):
                b = 8.0 - 2.0 * step / total + 0.01 * s
                gap = -0.05 if flip_at is None or step >= flip_at else +0.05
                lines.append(json.dumps({"step": step, "val/loss": b + (gap if gamma == 1.0 else 0.0)}))
            path.write_text("\n".join(lines) + "\n")
            final = json.loads(lines[-1])["val/loss"]
            rows.append(result_row(identity=ident, gamma=gamma, lr=3e-3, init_seed=s, train_seed=s, final_val_loss=final,
                             metrics_path=str(path)))
    return write_results(root, "curves", rows)


def test_a_gap_that_changes_sign_in_the_last_quarter_is_inconclusive(tmp_path):
    sweep = load([_curve_sweep(tmp_path, flip_at=90)])
    df = sweep.complete
    c = compare(df[df["gamma"] == 1.0], df[df["gamma"] == 0.5], "final_val_loss", curve="val/loss")
    assert c.status == A_LOWER  # the final gap alone would be real ...
    assert c.settled is False and "ranking still changing" in c.settle_note and "step 80" in c.settle_note
    v, why = verdict([c], A_LOWER)
    assert v == "inconclusive" and "still changing" in why  # ... but the ranking had not settled
    assert [t["step"] for t in c.over_training] == list(range(0, 101, 10))


def test_a_gap_that_held_over_the_last_quarter_decides(tmp_path):
    sweep = load([_curve_sweep(tmp_path / "early", flip_at=50)])
    df = sweep.complete
    c = compare(df[df["gamma"] == 1.0], df[df["gamma"] == 0.5], "final_val_loss", curve="val/loss")
    assert c.settled is True and verdict([c], A_LOWER)[0] == "supported"
    assert settled([{"step": 0, "diff": 1.0}, {"step": 100, "diff": -1.0}])[0] is None  # one eval: not checked


def test_a_null_with_six_pairs_is_inconclusive_and_names_the_excluded_effect():
    rng = np.random.default_rng(0)
    seeds = pd.DataFrame({"init_seed": range(6), "train_seed": range(6)})
    luck = rng.normal(0, 0.05, 6)
    a = seeds.assign(v=3.0 + luck + rng.normal(0, 0.01, 6))
    b = seeds.assign(v=3.0 + luck + rng.normal(0, 0.01, 6))
    c = compare(a, b, "v")
    assert c.n == 6 and c.lo < 0 < c.hi
    v, why = verdict([c], A_LOWER)
    assert v == "inconclusive"
    excluded = max(abs(c.lo), abs(c.hi))
    assert c.excluded == pytest.approx(excluded) and f"|effect| > {excluded:.3g} nats excluded" in why
    claim = claims_mod.Claim("x", "y", "", "")
    claim.decide([c], A_LOWER)
    assert claim.verdict == "inconclusive" and claim.excluded == pytest.approx(excluded)


def test_width_trend_recovers_a_known_slope_and_crossover(tmp_path):
    sweep = load([width_sweep(tmp_path, slope=-0.05, intercept=0.25)])
    df = sweep.complete
    base = df[df["gamma"] == 0.5]["variant"].iloc[0]
    recipe = df[df["gamma"] == 1.0]["variant"].iloc[0]
    t = width_trend(df, recipe, base, "final_val_loss")
    assert t.status == "fit" and t.seeds == 3 and len(t.points) == 4
    assert t.slope_lo < -0.05 < t.slope_hi and t.slope_hi < 0
    assert t.crossover == pytest.approx(math.exp(5.0), rel=0.25)  # 0.25 - 0.05 ln d = 0 at d = e^5 ≈ 148
    assert t.crossover_lo is not None and t.crossover_lo < t.crossover < t.crossover_hi
    assert all(p == 3e-3 for p in t.points["lr_recipe"].map(lambda v: v[0]))  # each arm at its best lr


def test_width_trend_in_the_summary_with_its_claim(tmp_path):
    out = build([width_sweep(tmp_path, slope=0.0, intercept=0.1, noise=0.02)], tmp_path / "reports",
                widths=(64, 128), n_boot=20, log=lambda _: None)
    s = json.loads((out / "summary.json").read_text())
    w = s["width_trend"]
    assert w["status"] == "fit" and w["slope_lo"] < 0 < w["slope_hi"]
    c = next(c for c in s["claims"] if "grows with width" in c["claim"])
    assert c["verdict"] == "inconclusive" and c["excluded"] == pytest.approx(max(-w["slope_lo"], w["slope_hi"]))
    n = c["numbers"][0]  # the claim keeps what each comparison of the other claims keeps
    assert n["n_confirm"] == 3 and n["p_holm"] == n["p_against"] == n["p_higher"] and 0 < n["p_signflip"] <= 1
    assert f"sign-flip p = {n['p_signflip']:.3g}" in " ".join(c["evidence"])
    assert "width_trend.png" in {f["file"] for f in s["figures"]}
    # docs/results.md renders the same evidence from the summary.
    from records import results_doc

    page = results_doc.section("width_trend", s, None)
    assert "**Learning rates.**" in page and "**Width trend**" in page and f"{w['slope']:+.4f}" in page
    assert "Previous protocol" not in page


def test_near_equal_lrs_are_one_grid_point_and_missing_columns_drop_nothing(tmp_path):
    rows = []
    for s in range(3):
        for g in (0.5, 1.0):
            for lr in (3e-3, 1e-2):
                lr_written = np.nextafter(lr, 1) if s == 2 else lr  # went through arithmetic somewhere
                rows.append(result_row(identity=f"{g}-{lr}-{s}", gamma=g, lr=lr_written, weight_decay=np.nan, init_seed=s,
                                 train_seed=s, final_val_loss=5 + g + (0 if lr == 3e-3 else 0.1) + s / 100))
    sweep = load([write_results(tmp_path, "near", rows)])
    chosen = sweep.tuning.chosen
    assert sweep.tuning.axes == ["lr"] and (chosen["lr"] == 3e-3).all() and (chosen["seeds"] == 3).all()
    assert chosen["lr_tried"].map(len).tolist() == [2, 2]
    assert len(sweep.complete) == 6  # every seed of each gamma, at its best lr


def test_no_comparison_is_not_run_and_the_sign_is_the_comparisons_own():
    empty = compare(pd.DataFrame({"init_seed": [], "train_seed": [], "v": []}),
                    pd.DataFrame({"init_seed": [0], "train_seed": [0], "v": [1.0]}), "v")
    assert verdict([empty], A_LOWER)[0] == "not run"
    trend = [{"step": s, "n": 3, "diff": -0.1} for s in (0, 50, 80, 90, 100)]
    assert settled(trend, final=-0.2)[0] is True
    assert settled(trend, final=+0.2)[0] is False  # the curve disagrees with the comparison's own sign
    # A last evaluation only some pairs logged does not end training.
    assert settled([*trend, {"step": 110, "n": 1, "diff": +0.5}], final=-0.1)[0] is True

