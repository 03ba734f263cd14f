"""The recipe's effective size read off the baseline's measured widths (experiments/fits/effective_width.py):
a known N_eff/N inside the widths is recovered with an interval that holds it; outside them the
answer is a bound, never an extrapolated number; a noisy bump in the baseline curve gives one answer."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from smallinit.experiments.fits.effective_width import effective_width, read_off

N = {96: 0.74e6, 128: 1.31e6, 192: 2.95e6}  # non-embedding parameters of three widths


def baseline_loss(n: float) -> float:
    return 2.0 + 40.0 * n ** -0.25


def tables(ratio: float, seeds: int = 6, noise: float = 0.004, seed: int = 0):
    """Baseline at the three widths; the recipe at d = 128 with the baseline's loss at ratio * N."""
    rng = np.random.default_rng(seed)
    base, rec = [], []
    for s in range(1, seeds + 1):
        luck = rng.normal(0, noise)  # a seed shifts both arms alike (paired seeds)
        for n in N.values():
            base.append(dict(seed=s, n_params=n, loss=baseline_loss(n) + luck + rng.normal(0, noise / 4)))
        rec.append(dict(seed=s, loss=baseline_loss(ratio * N[128]) + luck + rng.normal(0, noise / 4)))
    return pd.DataFrame(base), pd.DataFrame(rec)


def test_a_known_ratio_inside_the_widths_is_recovered_with_an_interval_that_holds_it():
    r = effective_width(*tables(1.44), n_self=N[128])
    assert r["kind"] == "inside" and r["ratio"] == pytest.approx(1.44, rel=0.08)
    lo, hi = r["ratio_ci"]
    assert lo < 1.44 < hi and r["n_inside"] == 6 and r["p_higher"] < 0.025  # N_eff > N beyond the spread
    assert "[" in r["text"]


def test_beyond_the_widest_baseline_the_answer_is_a_bound():
    r = effective_width(*tables(4.0), n_self=N[128])
    assert r["kind"] == "above" and r["ratio"] == pytest.approx(N[192] / N[128])
    assert r["ratio_ci"] is None and r["text"].startswith("N_eff/N > 2.25 on the seed means")


def test_a_bound_says_how_far_past_the_edge_width_the_recipe_sits_and_what_the_data_still_guarantee():
    """Far past the widest width (a ratio of 4 where the widths reach 2.25) the paired gap to it
    excludes 0 and the guaranteed ratio is the bound itself; a hair past it (2.3, inside the
    seeds' spread) the interval holds 0 and its far end reads back inside the widths."""
    far = effective_width(*tables(4.0), n_self=N[128])["edge"]
    assert far["seeds"] == 6 and far["ci"][1] < 0 < -far["gap"]
    assert far["limit"] == pytest.approx(N[192] / N[128])
    near = effective_width(*tables(2.3, noise=0.02, seed=3), n_self=N[128])
    lo, hi = near["edge"]["ci"]
    assert near["kind"] == "above" and lo < 0 < hi
    assert 1.0 < near["edge"]["limit"] < N[192] / N[128]
    assert f"N_eff/N ≥ {near['edge']['limit']:.3g} at the interval's end" in near["text"]


def test_below_the_narrowest_baseline_the_answer_is_a_bound():
    r = effective_width(*tables(0.3), n_self=N[128])
    assert r["kind"] == "below" and r["text"].startswith("N_eff/N < 0.565 on the seed means")
    assert r["edge"]["ci"][0] > 0 and "N_eff/N ≤ 0.565 at the interval's end" in r["text"]


def test_a_bump_in_the_baseline_curve_gives_one_crossing():
    x = np.log([1e6, 2e6, 4e6])
    # The 2e6 point is noisier than the trend (above the 1e6 point): the curve is taken as flat there.
    r = read_off(x, np.array([5.00, 5.02, 4.80]), target=4.90, log_n_self=math.log(2e6))
    assert r.kind == "inside" and 2e6 < r.n_eff < 4e6
