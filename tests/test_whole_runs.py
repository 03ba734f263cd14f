"""The whole-run lead reader: per budget, each schedule's lead paired by seed, their difference,
Holm over the family, and budgets without every confirm seed left waiting."""

import numpy as np
import pandas as pd
import pytest

from records.whole_runs import comparisons, judge, markdown
from smallinit.experiments.stats.paired import holm


def _pairs(budget, seeds, lead_cos, lead_wsd, noise=0.0):
    rng = np.random.default_rng(0)
    rows = []
    for s in seeds:
        for arm, c, w in (("baseline", 4.5, 4.4), ("small", 4.5 + lead_cos, 4.4 + lead_wsd)):
            rows.append({"budget": budget, "train_seed": s, "param.arm": arm, "lr_cosine": 4e-3 if arm == "baseline" else 2e-3,
                         "lr_wsd": 2e-3, "final_val_loss_cosine": c + noise * rng.normal(),
                         "final_val_loss_wsd": w + noise * rng.normal()})
    return pd.DataFrame(rows)


def test_each_schedules_lead_and_their_difference_are_paired_by_seed():
    pairs = _pairs(4194304, range(1, 7), lead_cos=-0.01, lead_wsd=-0.08, noise=0.01)
    rows, waiting = comparisons(pairs, {4194304: set(range(1, 7))}, "baseline")
    judge(rows)
    got = {r["comparison"]: r for r in rows}
    assert waiting == [] and set(got) == {"lead_cosine", "lead_wsd", "interaction"}
    assert np.allclose(got["interaction"]["diffs"], np.subtract(got["lead_wsd"]["diffs"], got["lead_cosine"]["diffs"]))
    assert got["lead_wsd"]["mean"] == pytest.approx(-0.08, abs=0.02)
    assert [r["p_holm"] for r in rows] == holm([r["p_two"] for r in rows])
    assert got["lead_wsd"]["verdict"] == "recipe ahead" and got["interaction"]["verdict"] == "larger under WSD"
    assert got["lead_cosine"]["lrs"]["cosine"] == {"baseline": [4e-3], "small": [2e-3]}
    assert got["lead_wsd"]["arm_means"]["small"] - got["lead_wsd"]["arm_means"]["baseline"] == pytest.approx(got["lead_wsd"]["mean"])
    assert "lead under WSD" in markdown(rows, waiting, {"wsd": "crossover", "cosine": ["whole_cosine_4m"]})


def test_an_interval_holding_zero_is_inconclusive_with_what_it_excludes():
    pairs = _pairs(4194304, range(1, 7), lead_cos=0.0, lead_wsd=0.0, noise=0.05)
    rows, _ = comparisons(pairs, {4194304: set(range(1, 7))}, "baseline")
    judge(rows)
    for r in rows:
        assert r["lo"] < 0 < r["hi"] and r["verdict"] == "inconclusive"
        assert r["excludes"] == f"below {r['lo']:+.4f} and above {r['hi']:+.4f}"


def test_a_budget_missing_a_confirm_seed_waits_and_is_not_read():
    pairs = _pairs(4194304, range(1, 5), lead_cos=-0.01, lead_wsd=-0.08)
    rows, waiting = comparisons(pairs, {4194304: set(range(1, 7))}, "baseline")
    assert rows == [] and waiting == ["4,194,304 tokens: 4 of 6 confirm seeds paired in both arms"]
