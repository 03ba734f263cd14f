"""The driver's closing lines: with seeds swept, the best setting by its seed mean (what the
report ranks), beside the single best trial."""

from __future__ import annotations

import pandas as pd

from smallinit.sweeper.results.summary import best_setting_line


def _table(rows):
    df = pd.DataFrame(rows, columns=["config/init.gamma", "config/seed", "budget_tokens", "final_val_loss"])
    return df.assign(swept="init.gamma,seed")


def test_the_best_setting_is_the_lowest_seed_mean_not_the_luckiest_trial():
    df = _table([(0.5, 0, 1024, 6.40), (0.5, 1, 1024, 6.70), (1.0, 0, 1024, 6.50), (1.0, 1, 1024, 6.52)])
    assert best_setting_line(df) == (
        "best setting: init.gamma=1, val loss 6.5100 (mean of 2 seeds), ahead of init.gamma=0.5 by 0.0400 nats "
        "(95% interval -1.7389 to 1.8189, paired over 2 seeds; it holds 0: not separated); the report gives the verdict")


def test_the_margin_over_the_next_setting_is_paired_by_seed_and_confirm_seeds_alone_count():
    """The main command answers with an interval: the lead over the runner-up, paired by seed
    (a seed's shared init noise cancels), and under the protocol only on confirm seeds."""
    rows = [(0.5, s, 1024, 6.6 + 0.01 * s) for s in range(3)] + [(1.0, s, 1024, 6.5 + 0.012 * s) for s in range(3)]
    line = best_setting_line(_table(rows))
    # d_s = 0.1 - 0.002 s: mean 0.098, sd 0.002, t(0.975, 2) = 4.3027: half-width 0.0050.
    assert "ahead of init.gamma=0.5 by 0.0980 nats (95% interval 0.0930 to 0.1030, paired over 3 seeds; it excludes 0)" in line
    # A tune seed where gamma 0.5 wins by far does not enter the comparison of the confirm seeds.
    df = _table([*rows, (0.5, 100, 1024, 1.0), (1.0, 100, 1024, 9.0)])
    df["role"] = ["confirm"] * 6 + ["tune"] * 2
    assert best_setting_line(df) == line


def test_a_budgets_table_ranks_settings_at_the_largest_budget():
    df = _table([(0.5, 0, 512, 6.0), (0.5, 1, 512, 6.0), (1.0, 0, 512, 7.0), (1.0, 1, 512, 7.0),
                 (0.5, 0, 1024, 5.9), (0.5, 1, 1024, 5.9), (1.0, 0, 1024, 5.5), (1.0, 1, 1024, 5.5)])
    assert best_setting_line(df).startswith("best setting: init.gamma=1, val loss 5.5000 (mean of 2 seeds")


def test_no_line_without_two_seeds_of_a_setting_or_without_seeds():
    assert best_setting_line(_table([(0.5, 0, 1024, 6.4), (1.0, 1, 1024, 6.5)])) is None
    assert best_setting_line(_table([]).drop(columns=["config/seed"])) is None


def test_a_grown_grid_whose_settings_leave_a_key_empty_still_gets_its_line():
    """A folder first swept over gamma, then over lr at the default gamma: rows of a setting that
    did not sweep a key hold it empty (where the trial's config could not fill it), and the
    line pairs such a setting by seed like any other."""
    df = pd.DataFrame({"config/init.gamma": [0.5, 0.5, None, None], "config/optim.lr": [None, None, 1e-3, 1e-3],
                       "config/seed": [0, 1, 0, 1], "budget_tokens": 1024, "final_val_loss": [6.4, 6.5, 6.3, 6.3],
                       "swept": "init.gamma,optim.lr,seed"})
    assert best_setting_line(df) == (
        "best setting: init.gamma=(not swept) optim.lr=0.001, val loss 6.3000 (mean of 2 seeds), ahead of init.gamma=0.5 "
        "optim.lr=(not swept) by 0.1500 nats (95% interval -0.4853 to 0.7853, paired over 2 seeds; it holds 0: not separated); "
        "the report gives the verdict")
