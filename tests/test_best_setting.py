"""The driver's closing lines: with seeds swept, the best setting by its seed mean (what the
report ranks), beside the single best trial."""

from __future__ import annotations

import pandas as pd

from smallinit.sweeper.results.summary import best_setting_line


def _table(rows):
    return pd.DataFrame(rows, columns=["param.init.gamma", "param.seed", "budget_tokens", "final_val_loss"])


def test_the_best_setting_is_the_lowest_seed_mean_not_the_luckiest_trial():
    df = _table([(0.5, 0, 1024, 6.40), (0.5, 1, 1024, 6.70), (1.0, 0, 1024, 6.50), (1.0, 1, 1024, 6.52)])
    assert best_setting_line(df) == ("best setting: init.gamma=1, val loss 6.5100 (mean of 2 seeds; "
                                      "the report gives its interval and the verdict)")


def test_a_budgets_table_ranks_settings_at_the_largest_budget():
    df = _table([(0.5, 0, 512, 6.0), (0.5, 1, 512, 6.0), (1.0, 0, 512, 7.0), (1.0, 1, 512, 7.0),
                 (0.5, 0, 1024, 5.9), (0.5, 1, 1024, 5.9), (1.0, 0, 1024, 5.5), (1.0, 1, 1024, 5.5)])
    assert best_setting_line(df).startswith("best setting: init.gamma=1, val loss 5.5000 (mean of 2 seeds")


def test_no_line_without_two_seeds_of_a_setting_or_without_seeds():
    assert best_setting_line(_table([(0.5, 0, 1024, 6.4), (1.0, 1, 1024, 6.5)])) is None
    assert best_setting_line(_table([]).drop(columns=["param.seed"])) is None
