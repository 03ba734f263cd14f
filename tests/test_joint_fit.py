"""The joint L(N, D) fit (experiments/fits/joint_fit.py) on synthetic cells with a known answer:
shared E, alpha, beta and each arm's A, B are recovered, so N_eff/N = (A_b / A_r)^(1/alpha) is
the one number built in; holding E elsewhere moves it, and the sensitivity table shows by how much."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from smallinit.experiments.fits.joint_fit import fit, sensitivity

TRUE = dict(E=1.8, alpha=0.34, beta=0.28, A={"baseline": 400.0, "recipe": 400.0 / 1.44**0.34},
            B={"baseline": 900.0, "recipe": 900.0})


def cells(noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = []
    for arm, widths in (("baseline", [0.7e6, 1.3e6, 3.0e6]), ("recipe", [1.3e6])):
        for n in widths:
            for d in [0.5e6, 1e6, 2e6, 4e6, 8e6]:
                loss = TRUE["E"] + TRUE["A"][arm] * n ** -TRUE["alpha"] + TRUE["B"][arm] * d ** -TRUE["beta"]
                out.append(dict(arm=arm, n=n, d=d, loss=loss + rng.normal(0, noise)))
    return pd.DataFrame(out)


def test_a_known_effective_size_is_recovered_from_one_recipe_width():
    f = fit(cells())
    assert f.alpha == pytest.approx(0.34, rel=0.05) and f.E == pytest.approx(1.8, abs=0.1)
    assert f.n_ratio("baseline", "recipe") == pytest.approx(1.44, rel=0.05)
    assert f.d_ratio("baseline", "recipe") == pytest.approx(1.0, rel=0.05)
    assert f.sse < 1e-6


def test_holding_e_elsewhere_moves_the_ratio_and_the_table_shows_it():
    s = sensitivity(cells(noise=0.002), "baseline", "recipe", e_values=(0.0, 1.0, 1.8))
    free = s[~s["e_fixed"]].iloc[0]
    assert free["n_ratio"] == pytest.approx(1.44, rel=0.15)
    held = s[s["e_fixed"]].set_index("E")
    assert held.loc[1.8, "n_ratio"] == pytest.approx(1.44, rel=0.15)
    assert held.loc[0.0, "sse"] > held.loc[1.8, "sse"]  # the wrong E fits worse
    assert len(s) == 4
