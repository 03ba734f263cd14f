"""The token crossover's fit on synthetic data with a known answer: each budget's gap pairs
the arms at that budget's own lr, the per-seed line recovers a known D* inside its Fieller
interval, a flat gap leaves D* unbounded, and Holm runs over the budget gaps and the slope."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from smallinit.experiments.fits import token_crossover as tc

BUDGETS = [524288, 1048576, 2097152, 4194304, 8388608]
# Each budget's chosen lr: the baseline's falls with the budget, the recipe's stays.
CHOSEN = {"baseline": {b: lr for b, lr in zip(BUDGETS, [16e-3, 16e-3, 8e-3, 8e-3, 4e-3])},
          "small": {b: 4e-3 for b in BUDGETS}}


def rows(d_star: float, slope: float, seeds=range(1, 7), noise: float = 0.01, seed: int = 0) -> pd.DataFrame:
    """Confirm rows whose gap (small - baseline) at the chosen lrs is slope * ln(D / d_star) plus
    per-seed noise, and decoy rows at lrs no budget chose (far off, so pairing them would show)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in seeds:
        for b in BUDGETS:
            base = 6.0 - 0.3 * math.log(b / BUDGETS[0]) + rng.normal(0, 0.02)
            gap = slope * math.log(b / d_star) + rng.normal(0, noise)
            out.append(dict(arm="baseline", seed=s, lr=CHOSEN["baseline"][b], budget_tokens=b, loss=base))
            out.append(dict(arm="small", seed=s, lr=CHOSEN["small"][b], budget_tokens=b, loss=base + gap))
            out.append(dict(arm="small", seed=s, lr=1e-3, budget_tokens=b, loss=base + 5.0))  # decoy
    return pd.DataFrame(out)


def test_a_known_crossover_is_recovered_inside_its_interval():
    out = tc.analyse(rows(d_star=3e6, slope=-0.05), CHOSEN, "baseline", "small")
    line = out["line"]
    lo, hi = line.d_star_interval()
    assert line.star_kind == "bounded" and lo < 3e6 < hi and line.d_star == pytest.approx(3e6, rel=0.3)
    assert line.b == pytest.approx(-0.05, abs=0.01) and line.n == 6
    assert "inside the measured budgets" in out["decision"] and "the recipe leads past D*" in out["decision"]
    # The gap at each budget is the decoy-free pairing: near slope * ln(D / D*).
    for g in out["budgets"]:
        assert g["gap"] == pytest.approx(-0.05 * math.log(g["tokens"] / 3e6), abs=0.02) and g["n"] == 6
    assert out["family_size"] == len(BUDGETS) + 1


def test_a_crossover_past_the_budgets_is_called_an_extrapolation():
    out = tc.analyse(rows(d_star=6e7, slope=-0.08, noise=0.003), CHOSEN, "baseline", "small")
    lo, hi = out["line"].d_star_interval()
    assert lo > BUDGETS[-1] and "beyond the measured budgets" in out["decision"]


def test_a_flat_gap_leaves_d_star_unbounded_and_every_budget_inconclusive():
    flat = rows(d_star=1.0, slope=0.0, noise=0.02)
    flat.loc[flat["arm"] == "small", "loss"] += 0.0  # gap = 0 + noise at every budget
    out = tc.analyse(flat, CHOSEN, "baseline", "small")
    assert out["line"].star_kind != "bounded" and out["decision"].startswith("D* not bounded")
    assert all(g["verdict"].startswith("inconclusive") for g in out["budgets"])


def test_holm_runs_over_the_budget_gaps_and_the_slope():
    out = tc.analyse(rows(d_star=3e6, slope=-0.05), CHOSEN, "baseline", "small")
    family = [g["p_two"] for g in out["budgets"]] + [out["line"].p_b_two]
    assert [g["p_holm"] for g in out["budgets"]] + [out["line"].p_b_holm] == pytest.approx(tc.holm(family))
    # Far from D* the gap is decided; at the budget nearest D* (2M-4M) it is not.
    verdicts = {g["tokens"]: g["verdict"] for g in out["budgets"]}
    assert verdicts[BUDGETS[0]] == "baseline ahead" and verdicts[BUDGETS[-1]] == "recipe ahead"


def test_fieller_matches_the_ratio_when_the_slope_is_sharp():
    kind, lo, hi = tc.fieller(a=0.2, b=-0.1, cov=np.diag([1e-6, 1e-6]), t=2.0)
    assert kind == "bounded" and lo < 2.0 < hi and hi - lo < 0.1
    assert tc.fieller(a=0.2, b=-0.001, cov=np.diag([1e-4, 1e-4]), t=2.0)[0] != "bounded"


def test_from_sweep_reads_the_chosen_lrs_of_a_per_budget_record(tmp_path):
    record = {"per_budget": True, "choices": [
        {"setting": {"arm": arm}, "chosen_by_budget": [{"budget_tokens": b, "chosen": {"optim.lr": lr}} for b, lr in c.items()]}
        for arm, c in CHOSEN.items()]}
    (tmp_path / "protocol.json").write_text(json.dumps(record))
    r = rows(d_star=3e6, slope=-0.05)
    df = pd.DataFrame({"state": "COMPLETE", "role": "confirm", "config/arm": r["arm"], "config/seed": r["seed"],
                       "lr": r["lr"], "budget_tokens": r["budget_tokens"], "final_val_loss": r["loss"]})
    out = tc.from_sweep(tmp_path, df)
    assert out["recipe"] == "small" and out["line"].n == 6 and out["chosen"]["baseline"][BUDGETS[0]] == 16e-3
    record["per_budget"] = False
    (tmp_path / "protocol.json").write_text(json.dumps(record))
    assert tc.from_sweep(tmp_path, df) is None


def test_the_section_draws_both_figures_and_keeps_the_line_in_the_summary(tmp_path):
    from smallinit.experiments.output.figures import Figures
    from smallinit.experiments.report.token_crossover_section import section

    out = tc.analyse(rows(d_star=3e6, slope=-0.05), CHOSEN, "baseline", "small")
    r = rows(d_star=3e6, slope=-0.05)
    out.update(chosen=CHOSEN, tune=r.drop(columns="seed").groupby(["arm", "lr", "budget_tokens"], as_index=False).mean())
    blocks, summary = section(out, Figures(tmp_path))
    assert (tmp_path / "crossover_gap.png").exists() and (tmp_path / "crossover_lr.png").exists()
    lo, hi = summary["line"]["d_star_interval"]
    assert lo < summary["line"]["d_star"] < hi and len(summary["per_seed"]) == 6
    assert any("D* = " in str(b.content) for b in blocks)


def test_the_status_grid_names_each_rows_seeds_and_a_budget_fewer_seeds_reached():
    """A row's mean is over its own seeds; a budget a running trial has not reached says n."""
    r = pd.DataFrame({"config/arm": ["baseline"] * 4 + ["small"] * 3,
                      "lr": [4e-3] * 4 + [2e-3] * 3,
                      "config/seed": [1, 1, 2, 2, 1, 1, 2],
                      "budget_tokens": [10, 20, 10, 20, 10, 20, 10],
                      "final_val_loss": [5.0, 4.0, 5.2, 4.2, 5.1, 4.1, 5.3]})
    header, body = tc.loss_grid(r, "final_val_loss")
    assert header == ["arm", "lr", "seeds", "10", "20"]
    assert body[0] == ["baseline", "0.004", "1-2", "5.1000", "4.1000"]
    assert body[1] == ["small", "0.002", "1-2", "5.2000", "4.1000 (n=1)"]
    assert tc._seed_list([5, 1, 2, 3, 2]) == "1-3, 5"


def test_docs_results_shows_the_records_gap_table_line_and_decision(tmp_path):
    """docs/results.md's block for a per-budget record reads the summary the report wrote (through
    JSON, as the committed file is read) and shows each budget's lrs, gap, interval and verdict."""
    from records.results_budgets import token_crossover_lines
    from smallinit.experiments.output.figures import Figures
    from smallinit.experiments.report.token_crossover_section import section

    out = tc.analyse(rows(d_star=3e6, slope=-0.05), CHOSEN, "baseline", "small")
    out.update(chosen=CHOSEN, tune=pd.DataFrame(columns=["arm", "lr", "budget_tokens", "loss"]))
    _, summary = section(out, Figures(tmp_path))
    text = "\n".join(token_crossover_lines(json.loads(json.dumps(summary, default=float))))
    body = [r for r in text.splitlines() if r.startswith("| 8,388,608")]
    assert len(body) == 1 and body[0].split(" | ")[1:3] == ["0.004", "0.004"] and body[0].endswith("| recipe ahead |")
    assert f"Holm over the {len(BUDGETS) + 1} comparisons" in text and "(6 seeds): slope -0.049" in text
    assert f"**Decision** (the rule fixed before the confirm seeds ran): {out['decision']}." in text
    # A budget with one seed has no interval: summary.json holds null there, and the page says "–".
    one = json.loads(json.dumps(summary, default=float).replace("NaN", "null"))
    one["budgets"][0].update(gap=None, lo=None, hi=None, p_signflip=None, p_holm=None, n=1)
    one["line"]["quad_ci"] = [None, None]
    text = "\n".join(token_crossover_lines(one))
    assert "| 524,288 | 0.016 | 0.004 |" in text and "| – | [–, –] | 1 |" in text and "term " in text


def test_a_gap_that_bends_is_said_to_make_the_line_an_approximation():
    """Level up to the middle budget, then falling (the shape a late crossover gives): the per-seed
    quadratic term is negative beyond its interval and the note says the line is an approximation."""
    rng = np.random.default_rng(1)
    out = []
    for s in range(1, 7):
        for b in BUDGETS:
            x = math.log(b / BUDGETS[2])
            gap = -0.05 * max(x, 0.0) + rng.normal(0, 0.005)
            out.append(dict(arm="baseline", seed=s, lr=CHOSEN["baseline"][b], budget_tokens=b, loss=5.0))
            out.append(dict(arm="small", seed=s, lr=CHOSEN["small"][b], budget_tokens=b, loss=5.0 + gap))
    line = tc.analyse(pd.DataFrame(out), CHOSEN, "baseline", "small")["line"]
    assert line.quad_ci[1] < 0
    assert "its slope falls as D grows" in tc.curvature_note(line.quad, line.quad_ci)
    straight = tc.analyse(rows(d_star=3e6, slope=-0.05), CHOSEN, "baseline", "small")["line"]
    assert straight.quad_ci[0] < 0 < straight.quad_ci[1] and tc.curvature_note(straight.quad, straight.quad_ci) == ""


def test_a_gap_that_never_changes_side_is_named_a_lead_not_a_crossover():
    from smallinit.experiments.fits.token_crossover import crossing_note

    def g(tokens, gap, verdict):
        return dict(tokens=tokens, gap=gap, lo=gap - 0.02, hi=gap + 0.02, p_holm=0.01 if "ahead" in verdict else 0.9,
                    verdict=verdict)

    lead = [g(1000, 0.001, "inconclusive"), g(2000, -0.005, "inconclusive"), g(4000, -0.08, "recipe ahead")]
    note = crossing_note(lead)
    assert "not a crossover" in note and "+0.0010 at 1,000" in note and "between 2,000 and 4,000 tokens" in note
    assert crossing_note([*lead[:2], g(8000, 0.09, "baseline ahead"), g(16000, -0.1, "recipe ahead")]) == ""
    assert crossing_note(lead[:2]) == ""  # no lead to place
