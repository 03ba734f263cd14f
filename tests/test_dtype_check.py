"""records/dtype_check.py: the bf16-against-fp32 gap, paired by seed, against the seed spread."""

import pandas as pd
import pytest

from records.dtype_check import dtype_gap, main
from smallinit.experiments.data.load import ReportError


def frame(fp32, bf16, seeds=(0, 1, 2), bf16_seeds=None):
    rows = [{"dtype": "fp32", "init_seed": s, "train_seed": s, "final_val_loss": v, "tokens_per_s": 1000.0}
            for s, v in zip(seeds, fp32)]
    rows += [{"dtype": "bf16", "init_seed": s, "train_seed": s, "final_val_loss": v, "tokens_per_s": 2500.0}
             for s, v in zip(bf16_seeds or seeds, bf16)]
    return pd.DataFrame(rows)


def test_gap_inside_the_seed_spread():
    g = dtype_gap(frame([4.00, 4.10, 4.20], [4.01, 4.09, 4.22]))
    assert g.pairs == 3
    assert g.gap == pytest.approx((0.01 - 0.01 + 0.02) / 3)
    assert g.seed_sd_fp32 == pytest.approx(0.1)
    assert g.gap_lo < g.gap < g.gap_hi
    assert g.inside_spread
    assert g.tokens_per_s_bf16 / g.tokens_per_s_fp32 == pytest.approx(2.5)
    assert g.lines()[-1].startswith("verdict: bf16 sits inside the seed spread (the data allows a bias up to")


def test_a_real_gap_is_named():
    g = dtype_gap(frame([4.00, 4.01, 4.02], [4.10, 4.12, 4.11]))
    assert g.gap == pytest.approx(0.1)
    assert not g.inside_spread
    assert g.verdict == "bf16 changes the loss (higher by 0.1000 nats)"


def test_a_null_wider_than_the_seed_spread_is_inconclusive():
    # One pair far off, the others close: the interval holds 0, the mean gap exceeds the fp32 sd.
    g = dtype_gap(frame([4.000, 4.010, 4.005], [4.060, 3.990, 4.012]))
    assert g.gap_lo < 0 < g.gap_hi
    assert abs(g.gap) > g.seed_sd_fp32
    assert not g.inside_spread
    assert g.verdict.startswith("inconclusive: no bias shown")
    assert f"{max(abs(g.gap_lo), abs(g.gap_hi)):.4f}" in g.verdict


def test_one_pair_decides_nothing():
    g = dtype_gap(frame([4.0], [4.0], seeds=(0,)))
    assert g.pairs == 1 and not g.inside_spread
    assert "one seed pair" in g.lines()[-1]


def test_a_missing_dtype_or_no_shared_seed_is_named():
    with pytest.raises(ReportError, match="no COMPLETE trial computed in bf16"):
        dtype_gap(frame([4.0, 4.1], []))
    with pytest.raises(ReportError, match="share no seed"):
        dtype_gap(frame([4.0, 4.1], [4.0, 4.1], bf16_seeds=(5, 6)))


def test_a_missing_folder_is_named(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"sweep={tmp_path / 'nope'}: no such folder" in err


def _curve(path, losses):
    import json

    path.write_text("".join(json.dumps({"step": 100 * (i + 1), "val/loss": v}) + "\n" for i, v in enumerate(losses)))
    return str(path)


def test_a_gap_whose_sign_flipped_late_in_training_is_not_called_a_change(tmp_path):
    # At the end bf16 is higher on every seed, but at 75% of training it was lower: unsettled.
    f = frame([4.00, 4.01, 4.02], [4.10, 4.12, 4.11])
    f["metrics_path"] = [_curve(tmp_path / f"{d}{s}.jsonl", [5.0, 4.5, 4.2 + (0.1 if d == "fp32" else 0.0), v])
                         for d, s, v in zip(f["dtype"], f["init_seed"], f["final_val_loss"])]
    g = dtype_gap(f)
    assert g.gap_lo > 0 and g.settled is False
    assert g.outcome == "inconclusive" and not g.inside_spread
    assert g.verdict.startswith("inconclusive: the final gap excludes 0 but ranking still changing")
    # The same trials with curves that held their order are a change.
    f["metrics_path"] = [_curve(tmp_path / f"held-{d}{s}.jsonl", [5.0, 4.5, v + 0.1, v])
                         for d, s, v in zip(f["dtype"], f["init_seed"], f["final_val_loss"])]
    assert dtype_gap(f).outcome == "changes" and dtype_gap(f).settled is True


def test_the_json_record_names_its_code_machine_and_the_table_it_read(tmp_path):
    import hashlib
    import json

    from smallinit.core.provenance import missing

    from .conftest import result_row, write_results

    rows = [result_row(dtype=d, init_seed=s, train_seed=s, seed=s, lr=1e-3, gamma=0.5, final_val_loss=v, tokens_per_s=1e3,
                       identity=f"{d}{s}") for d, vs in (("fp32", (4.0, 4.1, 4.2)), ("bf16", (4.01, 4.09, 4.22)))
            for s, v in enumerate(vs)]
    sweep = write_results(tmp_path, "bf16_check", rows)
    assert main([str(sweep), "--json", str(tmp_path / "out.json")]) == 0
    stamp = json.loads((tmp_path / "out.json").read_text())["provenance"]
    assert missing(stamp) == []
    assert stamp["results_sha256"]["bf16_check"] == hashlib.sha256((sweep / "results.parquet").read_bytes()).hexdigest()


def test_the_change_bf16_makes_to_the_arms_gap_is_the_paired_difference_of_gaps():
    from records.dtype_check import gap_change

    # small − baseline: fp32 -0.10, -0.12, -0.08; bf16 -0.09, -0.12, -0.06: changes +0.01, 0, +0.02
    base = frame([4.00, 4.10, 4.20], [4.01, 4.09, 4.22])
    small = frame([3.90, 3.98, 4.12], [3.92, 3.97, 4.16])
    g = gap_change(base, small)
    assert g.pairs == 3 and g.diffs == pytest.approx([0.01, 0.0, 0.02])
    # t interval: 0.01 ± 4.303 x 0.01 / sqrt(3) = [-0.0148, +0.0348]
    assert g.change == pytest.approx(0.01) and g.lo == pytest.approx(-0.0148, abs=1e-4) and g.hi == pytest.approx(0.0348, abs=1e-4)
    assert g.gap_fp32 == pytest.approx(-0.10) and g.gap_bf16 == pytest.approx(-0.09)
    assert g.verdict.startswith("no change of the gap shown: +0.0100 nats (95% interval -0.0148 to +0.0348); bf16 moves")
    # The same change against a gap smaller than what the interval allows: it licenses nothing.
    small_gap = gap_change(base, frame([3.99, 4.08, 4.19], [4.01, 4.07, 4.23]))
    assert small_gap.lo < 0 < small_gap.hi and max(-small_gap.lo, small_gap.hi) > abs(small_gap.gap_fp32)
    assert small_gap.verdict.startswith("inconclusive: no change of the gap shown") and "stay fp32" in small_gap.verdict
    assert set(g.arms) == {"baseline", "small"} and g.lines()[-1].startswith("verdict: ")


def test_a_gap_that_bf16_moves_is_named():
    from records.dtype_check import gap_change

    base = frame([4.00, 4.10, 4.20], [4.00, 4.10, 4.20])
    small = frame([3.90, 4.00, 4.10], [4.00, 4.11, 4.19])  # the lead shrinks by ~0.1 in bf16 on every seed
    g = gap_change(base, small)
    assert g.lo > 0 and g.verdict.startswith("bf16 changes the arms' gap by +0.1000")


def test_arms_without_a_shared_seed_are_refused():
    from records.dtype_check import gap_change

    with pytest.raises(ReportError, match="share no seed"):
        gap_change(frame([4.0, 4.1], [4.0, 4.1]), frame([4.0, 4.1], [4.0, 4.1], seeds=(5, 6)))
