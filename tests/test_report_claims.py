"""The report's claims about the paper's experiments: anchor phase diagram, recipe against
baseline, and how sweeps with paired seeds, `arm` overrides and gates are grouped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smallinit.experiments.claims import anchor_phase
from smallinit.experiments.claims import claims as claims_mod
from smallinit.experiments.data.load import load
from smallinit.experiments.fits.scaling import effective_size
from smallinit.experiments.report.context import best_gamma_table
from smallinit.experiments.report.report import build

from .conftest import synthetic_sweep


def synthetic_anchor_sweep(root: Path, small_infers: bool, seeds=2, depths=(2, 3, 4)) -> Path:
    """Anchor-task rows where gamma=1 answers the unseen pair inferentially (or not), with noise."""
    rng = np.random.default_rng(2)
    rows = []
    for depth in depths:
        for s in range(seeds):
            for gamma in (0.5, 1.0):
                inferential = 0.9 if (gamma == 1.0) == small_infers else 0.05
                rows.append(dict(identity=f"{depth}{s}{gamma}", state="COMPLETE", model="nano", n_params=10**6,
                                 d_model=128, n_layers=depth, gamma=gamma, init_seed=s, train_seed=s, eps=1e-12,
                                 norm="rmsnorm", gate="none", ffn="dense", task="anchor", lr=3e-3, tokens=10_000,
                                 final_val_loss=0.5 + rng.normal(0, 0.01), unigram_entropy=4.0,
                                 anchor_in_dist_acc=0.98 + rng.normal(0, 0.005),
                                 anchor_inferential_acc=inferential + rng.normal(0, 0.02),
                                 anchor_symmetric_acc=0.9 - inferential + rng.normal(0, 0.02)))
    d = root / ("anchor_yes" if small_infers else "anchor_no")
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(d / "results.parquet")
    return d


@pytest.mark.parametrize("small_infers,expected", [(True, "supported"), (False, "contradicted")])
def test_anchor_claim_reads_the_phase_diagram(tmp_path, small_infers, expected):
    sweep = load([synthetic_anchor_sweep(tmp_path, small_infers)])
    c = anchor_phase.anchor_claim(sweep.complete)
    assert c.verdict == expected, c.reason
    assert [n["n"] for n in c.numbers] == [6, 6]  # paired by (depth, seed): 3 depths x 2 seeds
    # A γ that did not learn the seen pairs is left out, and says so.
    unlearned = sweep.complete.assign(anchor_in_dist_acc=np.where(sweep.complete["gamma"] == 0.5, 0.02, 0.98))
    left_out = anchor_phase.anchor_claim(unlearned)
    assert left_out.verdict == "inconclusive" and "fewer than two γ learned" in left_out.reason
    assert any("left out" in e for e in left_out.evidence)
    table = anchor_phase.phase_table(sweep.complete)
    assert len(table) == 6 and set(table["seeds"]) == {2}


def test_anchor_report_has_the_phase_diagram_and_only_anchor_claims(tmp_path):
    out = build([synthetic_anchor_sweep(tmp_path, True)], tmp_path / "reports", widths=(64, 128), n_boot=20,
                log=lambda _: None)
    s = json.loads((out / "summary.json").read_text())
    assert [c["claim"].split(";")[0] for c in s["claims"]][0] == "Small init infers the unseen composition"
    assert len(s["claims"]) == 2 and len(s["anchor"]) == 6
    assert "anchor_phase.png" in {f["file"] for f in s["figures"]}


def test_recipe_claim_pairs_recipe_and_baseline_per_size(tmp_path):
    d = synthetic_sweep(tmp_path, gain=0.44)
    df = pd.read_parquet(d / "results.parquet")
    small = df["gamma"] == 1.0  # the paper's recipe: γ, eps and the gate changed together
    df.loc[small, "gate"] = "elementwise"
    df.loc[~small, "eps"] = 1e-5
    df.to_parquet(d / "results.parquet")
    sweep = load([d])
    df = sweep.complete
    base = df[df["gamma"] == 0.5]["variant"].iloc[0]
    recipe = df[df["gamma"] == 1.0]["variant"].iloc[0]
    c = claims_mod.recipe_claim(sweep, base, recipe, "final_val_loss")
    assert c.verdict == "supported" and len(c.numbers) == 4 and all(n["n"] == 3 for n in c.numbers)
    assert all(n["p_holm"] is not None and n["p_signflip"] == 0.25 for n in c.numbers)  # 3 pairs: 2/8 at best
    # The claim names every size, dense and MoE: the reason says how much of that the record ran.
    assert c.reason.endswith("; run at 4 sizes, dense only: the verdict reaches no further"), c.reason
    assert claims_mod.recipe_claim(sweep, None, recipe, "final_val_loss").verdict == "not run"


def test_a_gamma_only_record_does_not_run_the_recipe_claim(tmp_path):
    sweep = load([synthetic_sweep(tmp_path, gain=0.44)])  # eps 1e-12 and no gate in both arms
    df = sweep.complete
    base = df[df["gamma"] == 0.5]["variant"].iloc[0]
    recipe = df[df["gamma"] == 1.0]["variant"].iloc[0]
    c = claims_mod.recipe_claim(sweep, base, recipe, "final_val_loss")
    assert c.verdict == "not run" and "differs in γ only" in c.reason and not c.numbers


def test_paired_seed_and_arm_overrides_are_not_settings(tmp_path):
    """`seed=0,1,2` and `arm=baseline,small` are swept keys the resolved columns already hold:
    trials that differ only in them belong to one gamma curve, compared paired by seed."""
    d = synthetic_sweep(tmp_path, gain=0.2, sizes=(1e6,), seeds=3)
    df = pd.read_parquet(d / "results.parquet")
    df["config/seed"] = df["init_seed"]
    df["config/arm"] = np.where(df["gamma"] == 0.5, "baseline", "small")
    df["swept"] = "seed,arm"
    df.to_parquet(d / "results.parquet")
    sweep = load([d])
    assert sweep.complete["gamma_curve"].nunique() == 1 and sweep.complete["setting"].nunique() == 1
    assert best_gamma_table(sweep.complete, "final_val_loss")["seeds"].tolist() == [3]


def test_a_gate_that_adds_parameters_does_not_make_another_size(tmp_path):
    d = synthetic_sweep(tmp_path, gain=0.2, sizes=(1e6, 3e6), seeds=2)
    df = pd.read_parquet(d / "results.parquet")
    gated = df["gamma"] == 1.0
    df.loc[gated, "gate"] = "elementwise"
    df.loc[gated, "n_params"] += 4096  # W_theta
    df.to_parquet(d / "results.parquet")
    sweep = load([d])
    assert sweep.complete["size"].nunique() == 2
    assert all(g["gate"].nunique() == 2 for _, g in sweep.complete.groupby("size"))


def test_an_effective_size_interval_unbounded_above_excludes_nothing(tmp_path):
    es = effective_size(load([synthetic_sweep(tmp_path, gain=0.44)]), baseline_gamma=0.5, n_boot=20)
    g = es.gains
    # A resample at or below the fit's floor leaves N_eff unbounded: no effect size is excluded.
    es.gains = g.assign(gain_lo=-0.5, gain_hi=np.inf)
    claim = claims_mod.effective_size_claim(es, g["variant"].iloc[0])
    assert claim.verdict == "inconclusive" and "inf" not in claim.reason
    assert claim.reason.endswith("is unbounded: it excludes no size of effect")


def test_no_effective_size_when_a_larger_baseline_is_not_better(tmp_path):
    d = synthetic_sweep(tmp_path, gain=0.2, sizes=(1e6, 3e6, 1e7), seeds=3)
    df = pd.read_parquet(d / "results.parquet")
    df.loc[df["model"] == "m2", "final_val_loss"] += 1.0  # the largest model is the worst
    df.to_parquet(d / "results.parquet")
    es = effective_size(load([d]), baseline_gamma=0.5, n_boot=20)
    assert es.status != "fit" and "does not fall with model size" in es.status and es.gains is None
    assert claims_mod.effective_size_claim(es, None).verdict == "inconclusive"


def _trajectories(rises: dict[float, list[float]], pattern: bool = True) -> pd.DataFrame:
    """One probe trajectory per (γ, seed): |cos| 0.067 at step 0 rising by the given fraction."""
    rows = []
    for gamma, per_seed in rises.items():
        for i, rise in enumerate(per_seed, start=1):
            rows.append(dict(identity=f"{gamma}-{i}", size="micro", variant=f"γ={gamma:g}", gamma=gamma, seed=f"{i}/{i}",
                             start=0.067, peak=0.067 * (1 + rise), peak_step=1024, final=0.067 * (1 + rise / 2),
                             rank_start=40.0, rank_min=13.0, rank_final=19.0, pattern=pattern,
                             status="condense, expand" if pattern else "condense, plateau"))
    return pd.DataFrame(rows)


def test_condensation_is_supported_only_when_small_init_rises_more_beyond_the_seed_spread():
    """'Small init condenses, then expands' held to the rule the other claims follow: every
    small-init trial shows the pattern AND its rise beats γ < 1's paired by seed with an interval
    that excludes 0 (before: the two arms' mean rises were compared with no interval)."""
    from smallinit.experiments.claims.claims import condensation_claim

    clear = condensation_claim(_trajectories({1.0: [2.26, 2.35, 2.38, 2.18], 0.5: [0.45, 0.46, 0.46, 0.44]}))
    rise = clear.numbers[-1]
    assert clear.verdict == "supported" and rise["n"] == 4 and rise["lo"] > 1.5
    level = condensation_claim(_trajectories({1.0: [0.5, 0.3, 0.6, 0.4], 0.5: [0.45, 0.46, 0.35, 0.5]}))
    assert level.verdict == "inconclusive" and level.excluded is not None and "over 4 pairs" in level.reason
    # One small-init variant that rises less than γ = 0.5 is not averaged away by another that rises more.
    mixed = condensation_claim(_trajectories({1.0: [2.2, 2.3, 2.1, 2.2], 2.0: [0.2, 0.21, 0.19, 0.2],
                                              0.5: [0.45, 0.46, 0.44, 0.45]}))
    assert mixed.verdict == "contradicted" and "γ=2 − γ=0.5" in mixed.reason
    alone = condensation_claim(_trajectories({1.0: [2.26, 2.35, 2.38]}))
    assert alone.verdict == "inconclusive" and "no γ < 1 trial" in alone.reason
    reversed_ = condensation_claim(_trajectories({1.0: [0.3, 0.31, 0.29, 0.3], 0.5: [2.2, 2.3, 2.1, 2.25]}))
    assert reversed_.verdict == "contradicted" and "γ < 1 condenses more" in reversed_.reason
