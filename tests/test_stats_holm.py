"""Holm's correction, the exact sign-flip p, select-then-confirm seeds and claims scored on the
contrast a record holds: hand-computed values and small synthetic records."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from smallinit.experiments.claims import claims as claims_mod
from smallinit.experiments.claims.width import width_trend
from smallinit.experiments.data.load import ReportError, load
from smallinit.experiments.stats.paired import holm, one_comparison, signflip_p, t_pvalues
from smallinit.experiments.stats.stats import A_LOWER, compare, from_diffs, judge, outcome, verdict

from .conftest import width_sweep


def test_holm_matches_hand_computed_adjustments():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # 2 x 0.5 = 1, capped; the larger cannot be smaller
    assert holm([0.02]) == [0.02]  # a family of one is uncorrected
    with pytest.raises(ValueError, match="p-value nan is invalid"):
        holm([0.1, float("nan")])


def test_signflip_p_matches_hand_enumeration():
    # ±1 ±2 ±3: sums 6, 4, 2, 0, 0, -2, -4, -6; only ±6 reach |6|
    assert signflip_p([1, 2, 3]) == 0.25
    assert signflip_p([1, 2, 3], "greater") == 0.125
    assert signflip_p([1, 2, 3], "less") == 1.0
    # 0.5 - 0.2 + 0.3 + 0.4 = 1.0 (a float tie with the flip that turns only 0.2 negative counts):
    # sum >= 1.0 for the flips {} and {0.2} negative, <= -1.0 for their mirror images: 4 of 16.
    assert signflip_p([0.5, -0.2, 0.3, 0.4]) == 0.25
    assert signflip_p([0.5, -0.2, 0.3, 0.4], "greater") == 0.125
    assert math.isnan(signflip_p([]))
    assert signflip_p(np.ones(20)) < 1e-4  # sampled above 16 pairs: exact would be 2 / 2^20
    with pytest.raises(ValueError, match="alternative='up' is invalid"):
        signflip_p([1, 2], "up")


def test_t_pvalues_match_the_closed_form_for_two_degrees_of_freedom():
    # d = 1, 2, 3: mean 2, sd 1, t = 2 sqrt(3); with 2 dof, P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2
    t = 2 * math.sqrt(3)
    lower, higher = t_pvalues([1, 2, 3])
    assert higher == pytest.approx((1 - t / math.sqrt(t * t + 2)) / 2, rel=1e-9)
    assert lower == pytest.approx(1 - higher, rel=1e-9)
    c = from_diffs([1, 2, 3])
    assert c.p_higher == higher and c.p_signflip == 0.25 and c.diffs == [1.0, 2.0, 3.0]


def test_a_claim_on_one_set_of_per_seed_values_keeps_its_p_values_and_holm_leaves_them():
    p = one_comparison([1, 2, 3], predicted="less")  # t = 2 sqrt(3) on 2 dof, as above
    t = 2 * math.sqrt(3)
    assert p["p_higher"] == pytest.approx((1 - t / math.sqrt(t * t + 2)) / 2, rel=1e-9)
    assert p["p_against"] == p["p_holm"] == p["p_higher"] and p["p_signflip"] == 0.25 and p["n_confirm"] == 3
    assert one_comparison([1, 2, 3], predicted="greater")["p_against"] == p["p_lower"]
    with pytest.raises(ValueError, match="predicted='up' is invalid"):
        one_comparison([1, 2], predicted="up")


# Recipe minus baseline per seed at four sizes: the first is worse beyond its spread (t = 7.5,
# one-sided p = 0.0087 < 0.025) but not after Holm over four (4 x 0.0087 = 0.035 > 0.025).
WORSE = (0.10, 0.13, 0.16)
NULLS = ((0.01, -0.02, 0.005), (-0.01, 0.02, 0.0), (0.015, -0.01, -0.012))


def _recipe_record(root, sizes) -> pd.DataFrame:
    rows = []
    for i, diffs in enumerate(sizes):
        for s, gap in enumerate(diffs):
            base = 5.0 - 0.1 * i + 0.03 * s
            for arm, gamma, eps, gate, loss in (("b", 0.5, 1e-5, "none", base), ("r", 1.0, 1e-12, "elementwise", base + gap)):
                rows.append(dict(identity=f"{i}{s}{arm}", state="COMPLETE", model=f"m{i}", n_params=10**6 * (i + 1),
                                 d_model=64 * (i + 1), n_layers=2, gamma=gamma, init_seed=s, train_seed=s, eps=eps,
                                 norm="rmsnorm", gate=gate, ffn="dense", task="lm", lr=3e-3, tokens=10_000,
                                 final_val_loss=loss, unigram_entropy=7.0))
    d = root / f"recipe{len(sizes)}"
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(d / "results.parquet")
    return load([d])


def _recipe_claim(sweep):
    df = sweep.complete
    return claims_mod.recipe_claim(sweep, df[df["gamma"] == 0.5]["variant"].iloc[0],
                                   df[df["gamma"] == 1.0]["variant"].iloc[0], "final_val_loss")


def test_holm_turns_an_uncorrected_contradiction_into_inconclusive(tmp_path):
    alone = _recipe_claim(_recipe_record(tmp_path, [WORSE]))
    assert alone.verdict == "contradicted"  # a family of one: the interval's own rule
    p = alone.numbers[0]["p_against"]
    assert p == pytest.approx(0.00865, abs=2e-4) and alone.numbers[0]["p_holm"] == p

    four = _recipe_claim(_recipe_record(tmp_path, [WORSE, *NULLS]))
    worse = four.numbers[0]
    assert worse["status"] == "A higher" and worse["p_holm"] == pytest.approx(4 * p)
    assert worse["verdict"] == "inconclusive"  # the comparison's own word is the corrected one
    assert four.verdict == "inconclusive" and "not after Holm" in four.reason
    # Uncorrected, the same four comparisons would have been called contradicted.
    comps = [from_diffs(d) for d in (WORSE, *NULLS)]
    assert [outcome(c, A_LOWER) for c in comps][0] == "contradicted"
    judge(comps, A_LOWER)
    assert verdict(comps, A_LOWER)[0] == "inconclusive"


def _role_rows(tune_best: float, confirm_gap: float) -> list[dict]:
    """Tune seed 100 at three lrs (tune_best lowest for both arms); confirm seeds 1-4 at 3e-3."""
    rows = []
    for gamma, shift in ((0.5, 0.0), (1.0, confirm_gap)):
        for lr in (1e-3, 3e-3, 1e-2):
            rows.append(dict(identity=f"t{gamma}{lr}", role="tune", init_seed=100, train_seed=100, gamma=gamma, lr=lr,
                             final_val_loss=5.0 + (0 if math.isclose(lr, tune_best) else 0.2) + gamma / 100))
        for s in range(1, 5):
            rows.append(dict(identity=f"c{gamma}{s}", role="confirm", init_seed=s, train_seed=s, gamma=gamma, lr=3e-3,
                             final_val_loss=5.0 + shift + 0.05 * s + (0.01 if s % 2 else -0.01) * gamma))
    common = dict(state="COMPLETE", model="m", n_params=10**6, d_model=64, n_layers=2, eps=1e-12, norm="rmsnorm",
                  gate="none", ffn="dense", task="lm", tokens=10_000, unigram_entropy=7.0, weight_decay=0.1)
    return [{**common, **r} for r in rows]


def test_with_roles_the_lr_is_chosen_on_tune_seeds_and_only_confirm_seeds_are_compared(tmp_path):
    d = tmp_path / "roles"
    d.mkdir()
    pd.DataFrame(_role_rows(tune_best=3e-3, confirm_gap=-0.1)).to_parquet(d / "results.parquet")
    sweep = load([d])
    t = sweep.tuning
    assert t.roles and (t.chosen["lr"] == 3e-3).all() and (t.chosen["loss"] < 5.02).all()
    assert t.chosen["tune_seeds"].tolist() == [["100"], ["100"]] and t.chosen["n_confirm"].tolist() == [4, 4]
    assert "tuning seed(s) 100" in t.describe()
    df = sweep.complete
    assert set(df["role"]) == {"confirm"} and sorted(df["init_seed"].unique()) == [1, 2, 3, 4]
    c = compare(df[df["gamma"] == 1.0], df[df["gamma"] == 0.5], "final_val_loss")
    assert c.n == c.n_confirm == 4 and c.tune_seeds == ["100"]
    assert c.diff == pytest.approx(-0.1, abs=0.02)
    # 4 pairs: the exact sign-flip p cannot go below 2/16.
    assert c.p_signflip == pytest.approx(0.125) and "lr chosen on seed(s) 100" in c.text()


def test_with_roles_a_tune_choice_no_confirm_trial_ran_at_is_an_error_not_a_silent_fallback(tmp_path):
    d = tmp_path / "mismatch"
    d.mkdir()
    pd.DataFrame(_role_rows(tune_best=1e-2, confirm_gap=0.0)).to_parquet(d / "results.parquet")
    with pytest.raises(ReportError, match="no role=confirm trial at a chosen setting"):
        load([d])
    bad = pd.DataFrame(_role_rows(tune_best=3e-3, confirm_gap=0.0)).assign(role="select")
    (tmp_path / "bad").mkdir()
    bad.to_parquet(tmp_path / "bad" / "results.parquet")
    with pytest.raises(ReportError, match="role='select' is invalid: must be 'tune' or 'confirm'"):
        load([tmp_path / "bad"])


def _gate_record(root, gammas=(0.5, 1.0), seeds=4) -> object:
    """The gate lowers the loss by 0.10 at γ = 1 and by 0.01 at γ = 0.5, and the sink at γ = 1."""
    rng = np.random.default_rng(3)
    rows = []
    for s in range(seeds):
        luck = rng.normal(0, 0.05)
        for gamma in gammas:
            for gate in ("none", "elementwise"):
                gain = (0.10 if gamma == 1.0 else 0.01) if gate != "none" else 0.0
                rows.append(dict(identity=f"{s}{gamma}{gate}", state="COMPLETE", model="m", n_params=10**6, d_model=64,
                                 n_layers=2, gamma=gamma, init_seed=s, train_seed=s, eps=1e-12, norm="rmsnorm", gate=gate,
                                 ffn="dense", task="lm", lr=3e-3, tokens=10_000, unigram_entropy=7.0,
                                 final_val_loss=5.0 + luck - gain + rng.normal(0, 0.005),
                                 attn_sink=(0.1 if gate != "none" else 0.5) + rng.normal(0, 0.01)))
    d = root / f"gate{len(gammas)}"
    d.mkdir()
    pd.DataFrame(rows).to_parquet(d / "results.parquet")
    return load([d])


def test_the_gate_claim_is_scored_on_the_interaction_and_reports_the_main_effect_apart(tmp_path):
    c = claims_mod.gate_claim(_gate_record(tmp_path), "final_val_loss")
    assert c.verdict == "supported", c.reason
    inter = next(n for n in c.numbers if "(gate=elementwise − none at γ=1) − " in n["label"])
    assert inter["diff"] == pytest.approx(-0.09, abs=0.01) and inter["n"] == 4
    assert any("main effect, not scored" in e for e in c.evidence)
    only_small = claims_mod.gate_claim(_gate_record(tmp_path, gammas=(1.0,)), "final_val_loss")
    assert only_small.verdict == "not run" and "interaction" in only_small.reason
    assert "Sink: supported" in only_small.reason


def test_the_width_fit_leaves_out_one_head_widths_and_says_so(tmp_path):

    df = load([width_sweep(tmp_path, slope=-0.05, intercept=0.25)]).complete
    df = df.assign(n_heads=df["d_model"] // 64)
    t = width_trend(df, df[df["gamma"] == 1.0]["variant"].iloc[0], df[df["gamma"] == 0.5]["variant"].iloc[0],
                    "final_val_loss")
    assert t.status == "fit" and t.fit_widths == [128, 192, 256] and len(t.points) == 4
    assert t.points.set_index("d_model")["fitted"].to_dict() == {64: False, 128: True, 192: True, 256: True}
    assert "d = 64 (1 head) shown but not fitted" in t.fit_note
    assert t.slope_lo < -0.05 < t.slope_hi
    # The slope's p-values come from the fitted seeds' slopes alone (3 seeds: 3 confirm pairs).
    assert t.slope_p["n_confirm"] == 3 and t.slope_p["p_against"] > 0.975 and t.slope_p["p_signflip"] == 0.25


def test_the_update_to_stream_scaling_is_a_check_at_init_not_a_verdict():
    slopes = pd.DataFrame([dict(gamma=g, measured=1 - g, predicted=1 - g, widths=6) for g in (0.5, 1.0)])
    c = claims_mod.residual_claim(slopes)
    assert c.kind == claims_mod.CHECK and c.as_dict()["kind"] == "check at init" and c.verdict == "supported"
