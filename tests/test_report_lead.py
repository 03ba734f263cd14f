"""The report's first sentences on the main job's grid (γ x ε, 3 seeds): the best setting with
its interval, and the verdict of the best against the standard init (γ 0.5, ε 1e-5)."""

from __future__ import annotations

import json

import numpy as np

from smallinit.experiments.report.report import build

from .conftest import result_row, write_results


def grid_sweep(root, best_gap: float, seeds: int = 3, noise: float = 0.004):
    """γ {0.5, 1} x ε {1e-5, 1e-12}; γ = 1, ε = 1e-12 is best_gap below the standard init."""
    rng = np.random.default_rng(2)
    means = {(0.5, 1e-5): 6.00, (0.5, 1e-12): 6.01, (1.0, 1e-5): 6.03, (1.0, 1e-12): 6.00 - best_gap}
    rows = []
    for s in range(seeds):
        luck = rng.normal(0, noise)
        for (gamma, eps), m in means.items():
            rows.append(result_row(identity=f"{gamma}-{eps}-{s}", gamma=gamma, eps=eps, lr=3e-3, init_seed=s,
                                   train_seed=s, final_val_loss=m + luck + rng.normal(0, noise / 4)))
    return write_results(root, f"grid{best_gap}", rows)


def _sentences(tmp_path, gap):
    out = build([grid_sweep(tmp_path, gap)], tmp_path / "reports", widths=(64,), n_boot=20, log=lambda _: None)
    return json.loads((out / "summary.json").read_text())["findings"]["sentences"]


def test_a_clear_gain_is_ahead_of_the_standard_init_with_its_interval(tmp_path):
    line = next(s for s in _sentences(tmp_path, 0.05) if s.startswith("Against the baseline:"))
    import re

    gap = float(re.search(r"γ=1 \| eps=1e-12 against the standard init \(γ = 0.5, ε = 1e-5\): ([0-9.]+) nats \(95% interval", line)[1])
    assert abs(gap - 0.05) < 0.005 and "paired over 3 seeds: beyond the seed spread) below the standard." in line


def test_a_gain_inside_the_spread_is_inconclusive_and_says_what_it_excludes(tmp_path):
    line = next(s for s in _sentences(tmp_path, 0.002) if s.startswith("Against the baseline:"))
    assert "within the seed spread) below the standard: inconclusive, a difference beyond" in line
