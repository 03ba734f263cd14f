"""Validation-sampling error beside the seed spread (experiments/stats/valnoise.py).

Synthetic per-token files with a known window variance give the SE the formula says; in a
simulation where seeds share one validation sample the bootstrap over seeds and windows holds
the true difference where the seed-only t-interval does not, and widens with validation noise;
trials without per-token files leave every field null and the rest of the comparison as it was.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from records import results_doc
from smallinit.experiments.stats import valnoise
from smallinit.experiments.stats.paired import t_interval
from smallinit.experiments.stats.stats import compare, interaction

from .conftest import REPO

T = 16  # seq_len
W = 32  # per-token windows


def _trial(folder, targets, loss, seq_len=T, eval_tokens=W * T, trial_json=True) -> str:
    folder.mkdir(parents=True)
    np.savez_compressed(folder / "per_token_losses.npz", targets=targets.astype(np.int32), loss=loss.astype(np.float32))
    if trial_json:
        (folder / "trial.json").write_text(json.dumps({"identity": folder.name, "config": {
            "train": {"seq_len": seq_len, "eval_tokens": eval_tokens}}}))
    return str(folder / "per_token_losses.npz")


def _arms(tmp_path, seed_shift, window_shift, eval_tokens=W * T, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Arm A = arm B + seed_shift[i] + window_shift[w] on every token of window w, plus token noise
    that averages to zero inside each window; final_val_loss is each trial's mean per-token loss."""
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 100, W * T)
    rows = {"a": [], "b": []}
    for i, s in enumerate(seed_shift):
        base = rng.uniform(2, 6, W * T)
        wiggle = rng.normal(0, 0.3, (W, T))
        wiggle -= wiggle.mean(axis=1, keepdims=True)
        losses = dict(a=base + s + np.repeat(window_shift, T) + wiggle.ravel(), b=base)
        for arm, loss in losses.items():
            path = _trial(tmp_path / f"{arm}{i}", targets, loss, eval_tokens=eval_tokens, **kw)
            rows[arm].append(dict(init_seed=0, train_seed=i, final_val_loss=float(loss.astype(np.float32).mean()),
                                  per_token_losses_path=path))
    return pd.DataFrame(rows["a"]), pd.DataFrame(rows["b"])


SEEDS = np.array([0.01, -0.02, 0.03, 0.005])
ALTERNATING = 0.02 * (-1.0) ** np.arange(W)  # window sd exactly 0.02 * sqrt(W / (W - 1))


def test_known_window_variance_gives_the_expected_val_se_and_seed_se(tmp_path):
    a, b = _arms(tmp_path, SEEDS, ALTERNATING)
    c = compare(a, b, "final_val_loss", curve="val/loss")
    assert c.val_se == pytest.approx(0.02 / math.sqrt(W - 1), rel=1e-4)
    assert c.seed_se == pytest.approx(SEEDS.std(ddof=1) / 2, rel=1e-3)
    assert c.val_ratio == pytest.approx(c.val_se / c.seed_se)
    assert c.val_windows == W
    assert c.diff == pytest.approx(SEEDS.mean(), abs=1e-5)
    assert c.as_dict()["ci_boot"] == c.ci_boot and c.ci_boot[0] < c.diff < c.ci_boot[1]
    assert "over seeds and validation windows" in c.text()


def test_val_se_is_for_the_windows_the_compared_loss_averages(tmp_path):
    # eval_tokens of 8 windows: the loss compared averages 8 windows, the sd is read on all 32.
    a, b = _arms(tmp_path, SEEDS, ALTERNATING, eval_tokens=8 * T)
    c = compare(a, b, "final_val_loss", curve="val/loss")
    assert c.val_windows == 8
    assert c.val_se == pytest.approx(0.02 * math.sqrt(W / (W - 1)) / math.sqrt(8), rel=1e-4)


def test_interaction_window_contrast(tmp_path):
    """(A1 - B1) - (A0 - B0): the window contrast is A1's windows minus A0's (B1 = B0 = base)."""
    a1, b1 = _arms(tmp_path / "1", SEEDS, ALTERNATING)
    a0, b0 = _arms(tmp_path / "0", SEEDS * 0, ALTERNATING * 0)
    c = interaction(a1, b1, a0, b0, "final_val_loss", curve="val/loss")
    assert c.val_se == pytest.approx(0.02 / math.sqrt(W - 1), rel=1e-3)
    assert c.seed_se == pytest.approx(SEEDS.std(ddof=1) / 2, rel=1e-3)


@pytest.mark.parametrize("damage", ["one file missing", "no column", "no trial.json", "other tokens"])
def test_missing_or_mismatched_files_leave_the_fields_null_and_the_rest_unchanged(tmp_path, damage):
    a, b = _arms(tmp_path, SEEDS, ALTERNATING, trial_json=damage != "no trial.json")
    if damage == "one file missing":
        a.loc[2, "per_token_losses_path"] = None
    elif damage == "no column":
        a, b = a.drop(columns="per_token_losses_path"), b.drop(columns="per_token_losses_path")
    elif damage == "other tokens":
        z = dict(np.load(a.loc[1, "per_token_losses_path"]))
        np.savez_compressed(tmp_path / "a1" / "per_token_losses.npz", targets=z["targets"][::-1], loss=z["loss"])
        valnoise._trial_windows.cache_clear()
    c = compare(a, b, "final_val_loss", curve="val/loss")
    assert (c.val_se, c.seed_se, c.val_ratio, c.ci_boot, c.val_windows) == (None,) * 5
    plain = compare(a.drop(columns="per_token_losses_path", errors="ignore"),
                    b.drop(columns="per_token_losses_path", errors="ignore"), "final_val_loss")
    assert (c.diff, c.lo, c.hi, c.p_signflip, c.status) == (plain.diff, plain.lo, plain.hi, plain.p_signflip, plain.status)
    assert "validation windows" not in c.text()


def test_comparisons_that_are_not_losses_are_not_measured(tmp_path):
    a, b = _arms(tmp_path, SEEDS, ALTERNATING)
    assert compare(a, b, "final_val_loss").val_se is None  # no curve: not the loss the lrs were tuned on


def _crossed(rng, n, w, sd_seed, sd_window, sd_cell, delta):
    """Per-pair, per-window differences with seeds and windows crossed (every pair scored on the
    same windows) and the compared loss as each pair's window mean."""
    e = delta + rng.normal(0, sd_seed, n)[:, None] + sd_window * rng.normal(0, 1, w)[None, :] + rng.normal(0, sd_cell, (n, w))
    return e.mean(axis=1), e


def test_bootstrap_holds_the_true_difference_where_the_seed_interval_does_not():
    """Validation noise twice the seed spread: 20 pairs, 64 windows, 200 records."""
    rng, delta, reps = np.random.default_rng(1), -0.03, 200
    boot = t = 0
    for r in range(reps):
        d, e = _crossed(rng, 20, 64, 0.02, 0.08, 0.05, delta)
        lo, hi = valnoise.measure(d, e, n_boot=500, seed=r).ci_boot
        boot += lo <= delta <= hi
        _, tlo, thi = t_interval(d)
        t += tlo <= delta <= thi
    # True SE: sqrt(0.02²/20 + 0.08²/64 + 0.05²/1280) = 0.0111; the t-interval sees ~0.0045 of it.
    assert boot / reps >= 0.92, boot / reps
    assert t / reps <= 0.75, t / reps
    print(f"coverage of the true difference: bootstrap {boot / reps:.3f}, t-interval {t / reps:.3f}")


def test_bootstrap_widens_when_validation_noise_grows_and_the_t_interval_does_not():
    widths, t_widths, ratios = [], [], []
    for scale in (0.0, 0.05, 0.15):
        d, e = _crossed(np.random.default_rng(3), 6, 64, 0.02, scale, 0.01, 0.0)
        v = valnoise.measure(d, e)
        widths.append(v.ci_boot[1] - v.ci_boot[0])
        ratios.append(v.ratio)
        _, lo, hi = t_interval(d)
        t_widths.append(hi - lo)
    assert widths[0] < widths[1] < widths[2] and widths[2] > 1.5 * widths[0]
    assert ratios[0] < ratios[1] < ratios[2]
    assert t_widths == pytest.approx([t_widths[0]] * 3)  # a window shift moves every pair alike


def test_measure_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"e of shape \(3, 5\)"):
        valnoise.measure([0.1, 0.2], np.zeros((3, 5)))


def _number(label, val_se, seed_se, windows=64):
    return dict(label=label, diff=-0.01, val_se=val_se, seed_se=seed_se, val_windows=windows)


def test_record_sentence_says_small_or_not():
    small = valnoise.record_sentence([_number("x", 0.001, 0.01), _number("y", 0.002, 0.02), _number("y", 0.002, 0.02)])
    assert small.startswith("Validation sampling: over 2 loss comparison(s)")
    assert "0.0010–0.0020 nats against a seed SE of 0.0100–0.0200, a ratio of at most 0.10, so it is small" in small
    big = valnoise.record_sentence([_number("x", 0.001, 0.01), _number("z", 0.006, 0.01)])
    assert "ratio of at most 0.60: not small next to the seed spread in 1 of 2" in big
    assert valnoise.record_sentence([dict(label="old", diff=0.1, val_se=None, seed_se=None)]) is None


def test_results_doc_states_it_only_where_measured():
    s = json.loads((REPO / "docs/results/gate/summary.json").read_text())
    for n in (n for c in s["claims"] for n in c["numbers"]):  # as a record from before per-token losses
        n.pop("val_se", None), n.pop("seed_se", None)
    assert "Validation sampling" not in results_doc.section("gate", s, None)
    s["claims"][0]["numbers"] = [_number("γ=1 vs 0.5", 0.0012, 0.02)]
    assert "over 1 loss comparison(s) the validation-sampling SE of the paired difference (64 windows) is 0.0012 nats" \
        in results_doc.section("gate", s, None)


def test_on_the_tiny_sweep_val_se_matches_the_per_token_files(tiny_sweep):
    """The real trials: 2 seeds, per-token windows of 32 tokens (8 of them), eval on 16 windows."""
    from smallinit.experiments.data.load import load

    df = load([tiny_sweep]).complete
    g = df[np.isclose(df["eps"], 1e-5)]
    a, b = g[np.isclose(g["gamma"], 1.0)], g[np.isclose(g["gamma"], 0.5)]
    c = compare(a, b, "final_val_loss", curve="val/loss")
    ka, kb = (x.set_index("train_seed").sort_index() for x in (a, b))
    e = np.stack([valnoise.window_means(np.load(ka.loc[s, "per_token_losses_path"])["loss"], 32)
                  - valnoise.window_means(np.load(kb.loc[s, "per_token_losses_path"])["loss"], 32) for s in ka.index])
    assert e.shape == (2, 8) and c.val_windows == 512 // 32
    assert c.val_se == pytest.approx(e.mean(axis=0).std(ddof=1) / math.sqrt(16), rel=1e-6)
    assert c.seed_se == pytest.approx(np.std(c.diffs, ddof=1) / math.sqrt(2))
    assert c.ci_boot[0] <= c.ci_boot[1]


def test_the_report_page_states_it_under_the_verdicts_only_where_measured():
    from types import SimpleNamespace

    from smallinit.experiments.claims.claims import Claim
    from smallinit.experiments.report import sections

    claim = Claim("c", "p", "inconclusive", "r", numbers=[dict(label="old", diff=0.1)])
    blocks, _ = sections.verdicts(SimpleNamespace(claims=[claim]))
    assert not any("Validation sampling" in str(b.content) for b in blocks)
    claim.numbers.append(_number("new", 0.004, 0.01))
    blocks, _ = sections.verdicts(SimpleNamespace(claims=[claim]))
    assert blocks[-1].kind == "p" and "ratio of at most 0.40: not small" in blocks[-1].content
